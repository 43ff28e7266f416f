// Whole-file reads of paths a user or a checkpoint names: only a regular file is read (opening
// a FIFO blocks until a writer comes, and a device may never end), and only up to a size the
// caller states, so a damaged folder is an error naming the file, never a hang or a huge
// allocation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "base/status.h"

namespace peerserve {

// The contents of `path`. NotFound when it does not exist; InvalidArgument when it is not a
// regular file or holds more than `max_bytes`; IoError when it cannot be read.
Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes);

// OK when `dir` is a directory; else NotFound "DIR: no such directory (WHAT)" or
// "DIR: not a directory (WHAT)", `what` saying what it should hold, e.g. "the model folder".
Status require_directory(const std::filesystem::path& dir, const std::string& what);

// The first bytes of a file or a pipe a user names for text (a shell's <(...) is a pipe), at
// most `max_bytes` of them; `more` says whether the text went on. A directory (it reads as
// nothing) and a device (/dev/zero never ends) are refused: InvalidArgument naming `what`,
// e.g. "--chat-template t.jinja". NotFound when it does not exist, IoError when unreadable.
struct TextPrefix {
  std::string text;
  bool more = false;
};
Result<TextPrefix> read_text_file_or_pipe(const std::filesystem::path& path,
                                          const std::string& what, uint64_t max_bytes);

}  // namespace peerserve
