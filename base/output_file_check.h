// check_output_file: whether a file a command will write at its end can be written, asked
// before the work (a model load, a long simulation or benchmark) rather than after it.
#pragma once

#include <string>

#include "base/status.h"

namespace peerserve {

// Ok when `path` names no directory and its parent folder exists and is writable (the file
// itself may or may not exist yet). `flag` names the option in the error.
Status check_output_file(const std::string& flag, const std::string& path);

}  // namespace peerserve
