// The most unparsed bytes an HTTP connection's read buffer may hold (server and clients).
// Boost.Beast checks its header limit only on the start line and the header fields: a chunk
// size line, chunk extension or trailer without its CRLF was read into an unbounded buffer
// for as long as the read deadline lasted. Past this the read fails with buffer_overflow.
// Room for the 64 KiB header limit and a few 64 KiB reads of body.
#pragma once

#include <cstddef>

namespace peerserve {

inline constexpr size_t kMaxUnparsedHttpBytes = 256 * 1024;

}  // namespace peerserve
