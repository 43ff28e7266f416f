// Byte sizes on the command line: "1073741824", "512M", "512MiB", "4G", "64k" (binary
// multiples, case-insensitive). Overflow and junk are errors naming the flag.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace peerserve {

Result<uint64_t> parse_byte_size(const std::string& flag, const std::string& text);

}  // namespace peerserve
