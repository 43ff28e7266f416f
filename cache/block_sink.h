// BlockSink: where a tier copies a block it found. The tier calls it once with the block's
// size and copies the block into the returned span, which must be exactly that long; so a
// caller with a fixed buffer (a KV block) checks the size, and a caller that does not know
// it (a server filling a reply) sizes its buffer then. Returning a span of another size
// makes the read fail with InvalidArgument naming both sizes. This is the only copy a read
// makes on the DRAM path.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace peerserve {

using BlockSink = std::function<std::span<std::byte>(size_t block_size)>;

// A sink for a caller-owned buffer of a known size.
inline BlockSink sink_into(std::span<std::byte> buffer) {
  return [buffer](size_t) { return buffer; };
}

}  // namespace peerserve
