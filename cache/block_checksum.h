// The checksum stored with every block in the SSD tier and verified on every read from it:
// XXH3-64 (libxxhash), ~20 GB/s on one core here, so verification costs a fraction of the
// read itself. A corrupt block is reported as a miss, never returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace peerserve {

uint64_t block_checksum(std::span<const std::byte> bytes);

}  // namespace peerserve
