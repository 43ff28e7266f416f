// check_output_file: whether a file a command will write at its end can be written, asked
// before the work (a model load, a long simulation or benchmark) rather than after it.
#pragma once

#include <string>

#include "base/status.h"

namespace peerserve {

// Ok when `path` names an existing file this process may write, or no file yet (nor a
// link to none) in a folder that exists and is writable; a symbolic link is followed to
// where the write would go. Never a directory. `flag` names the option in the error.
Status check_output_file(const std::string& flag, const std::string& path);

}  // namespace peerserve
