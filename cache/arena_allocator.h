// ArenaAllocator: first-fit placement of variable-size byte ranges in one fixed arena
// [0, capacity), with neighbouring free ranges merged on release. It hands out offsets
// only; the owner (DramTier) holds the memory and decides what to evict when allocate()
// finds no hole.
//
// Every range is rounded up to kAlignment bytes (cache-line aligned copies).
// Thread-safety: none; the owner serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace peerserve {

class ArenaAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;

  explicit ArenaAllocator(uint64_t capacity);

  // The offset of a free range of at least `size` bytes (size > 0), or nullopt if no hole
  // is large enough.
  std::optional<uint64_t> allocate(uint64_t size);
  // Returns the range allocate() gave for `size` at `offset`.
  void release(uint64_t offset, uint64_t size);

  uint64_t capacity() const { return capacity_; }
  uint64_t allocated_bytes() const { return allocated_; }  // after rounding
  uint64_t largest_free_range() const;
  static uint64_t rounded(uint64_t size) {
    return (size + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  uint64_t capacity_;
  uint64_t allocated_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, non-adjacent
};

}  // namespace peerserve
