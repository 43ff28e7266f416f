#include "cache/arena_allocator.h"

#include <algorithm>
#include <iterator>

#include "base/check.h"

namespace peerserve {

ArenaAllocator::ArenaAllocator(uint64_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::optional<uint64_t> ArenaAllocator::allocate(uint64_t size) {
  PS_CHECK(size > 0);
  const uint64_t need = rounded(size);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + need, rest);
    allocated_ += need;
    return offset;
  }
  return std::nullopt;
}

void ArenaAllocator::release(uint64_t offset, uint64_t size) {
  uint64_t length = rounded(size);
  PS_CHECK_LE(offset + length, capacity_);
  PS_CHECK_LE(length, allocated_);
  allocated_ -= length;
  auto next = free_.lower_bound(offset);
  PS_CHECK(next == free_.end() || next->first >= offset + length) << "double release";
  if (next != free_.end() && next->first == offset + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    PS_CHECK_LE(prev->first + prev->second, offset);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_.emplace(offset, length);
}

uint64_t ArenaAllocator::largest_free_range() const {
  uint64_t best = 0;
  for (const auto& [offset, length] : free_) best = std::max(best, length);
  return best;
}

}  // namespace peerserve
