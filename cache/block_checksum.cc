#include "cache/block_checksum.h"

#include <xxhash.h>

namespace peerserve {

uint64_t block_checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace peerserve
