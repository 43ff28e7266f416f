// HashRing: consistent hashing of pool keys onto pool members (the paper's DHT view).
//
// Each member owns `virtual_nodes` points on a 64-bit ring (XXH3 of "<member>#<i>"); a key
// belongs to the first point at or after its own position. Adding a member moves only the
// keys that now fall before one of its points, about 1/(n+1) of them, all to the new member;
// the others stay where they were. Members are named (e.g. "host:port"), so every client
// that lists the same members places every key the same way, whatever the list's order.
//
// Thread-safety: none; PoolClient guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cache/pool_key.h"

namespace peerserve {

class HashRing {
 public:
  explicit HashRing(int virtual_nodes = 160);

  // Adds a member and returns its index (members are numbered in the order added).
  // REQUIRES: the name is not in the ring yet.
  size_t add(const std::string& member);
  size_t size() const { return members_.size(); }
  const std::string& member(size_t index) const { return members_[index]; }

  // The member that owns `key`. REQUIRES: size() > 0.
  size_t owner(const PoolKey& key) const;

  // The ring position of a key (tenant and hash both count).
  static uint64_t position(const PoolKey& key);

 private:
  int virtual_nodes_;
  std::vector<std::string> members_;
  std::vector<std::pair<uint64_t, size_t>> points_;  // sorted by position
};

}  // namespace peerserve
