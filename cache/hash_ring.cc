#include "cache/hash_ring.h"

#include <xxhash.h>

#include <algorithm>

#include "base/check.h"

namespace peerserve {

HashRing::HashRing(int virtual_nodes) : virtual_nodes_(virtual_nodes) {
  PS_CHECK(virtual_nodes > 0);
}

size_t HashRing::add(const std::string& member) {
  PS_CHECK(std::find(members_.begin(), members_.end(), member) == members_.end())
      << "member " << member << " added twice";
  const size_t index = members_.size();
  members_.push_back(member);
  for (int i = 0; i < virtual_nodes_; ++i) {
    const std::string label = member + "#" + std::to_string(i);
    points_.emplace_back(XXH3_64bits(label.data(), label.size()), index);
  }
  // Ties (2^-64) broken by member name so that every client agrees.
  std::sort(points_.begin(), points_.end(), [this](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return members_[a.second] < members_[b.second];
  });
  return index;
}

uint64_t HashRing::position(const PoolKey& key) {
  const uint64_t tenant = XXH3_64bits(key.tenant.data(), key.tenant.size());
  return XXH3_64bits_withSeed(&key.hash, sizeof(key.hash), tenant);
}

size_t HashRing::owner(const PoolKey& key) const {
  PS_CHECK(!points_.empty()) << "hash ring has no members";
  const uint64_t pos = position(key);
  auto it = std::lower_bound(points_.begin(), points_.end(), pos,
                             [](const auto& point, uint64_t p) { return point.first < p; });
  if (it == points_.end()) it = points_.begin();  // wrap around
  return it->second;
}

}  // namespace peerserve
