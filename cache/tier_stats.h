// Counters and occupancy of one storage tier (DRAM or SSD) of a cache server.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace peerserve {

struct TierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // stored blocks plus writes in progress
  uint64_t blocks = 0;      // stored (readable) blocks
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;          // blocks dropped to make room (capacity or tenant quota)
  uint64_t checksum_failures = 0;  // SSD reads rejected by their checksum (each also a miss)
  uint64_t errors = 0;             // failed writes and I/O errors
  uint64_t bytes_read = 0;         // payload bytes returned by hits
  uint64_t bytes_written = 0;      // payload bytes stored
  std::map<std::string, uint64_t> tenant_used_bytes;
};

}  // namespace peerserve
