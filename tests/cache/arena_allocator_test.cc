// ArenaAllocator against a byte-occupancy reference on random allocate/release sequences.
#include "cache/arena_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace peerserve {
namespace {

TEST(ArenaAllocatorTest, RandomSequencesNeverOverlapAndCoalesceBack) {
  constexpr uint64_t kCapacity = 64 * 1024;
  ArenaAllocator arena(kCapacity);
  std::vector<int> owner(kCapacity, -1);  // reference: which live range holds each byte
  struct Live {
    uint64_t offset, size;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(7);
  int failures = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t size = 1 + rng() % 3000;
      std::optional<uint64_t> offset = arena.allocate(size);
      if (!offset) {
        ++failures;
        // No hole of the rounded size may exist in the reference either.
        const uint64_t need = ArenaAllocator::rounded(size);
        uint64_t run = 0, best = 0;
        for (uint64_t i = 0; i < kCapacity; ++i) {
          run = owner[i] < 0 ? run + 1 : 0;
          best = std::max(best, run);
        }
        EXPECT_LT(best, need);
        continue;
      }
      ASSERT_EQ(*offset % ArenaAllocator::kAlignment, 0u);
      ASSERT_LE(*offset + size, kCapacity);
      for (uint64_t i = *offset; i < *offset + ArenaAllocator::rounded(size); ++i) {
        ASSERT_EQ(owner[i], -1) << "overlap at byte " << i;
        owner[i] = step;
      }
      live.push_back({*offset, size});
    } else {
      const size_t pick = rng() % live.size();
      const Live victim = live[pick];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
      arena.release(victim.offset, victim.size);
      for (uint64_t i = victim.offset; i < victim.offset + ArenaAllocator::rounded(victim.size);
           ++i) {
        owner[i] = -1;
      }
    }
  }
  EXPECT_GT(failures, 0);  // the sequence did fill the arena
  for (const Live& l : live) arena.release(l.offset, l.size);
  EXPECT_EQ(arena.allocated_bytes(), 0u);
  EXPECT_EQ(arena.largest_free_range(), kCapacity);
}

TEST(ArenaAllocatorTest, NeighboursMergeOnRelease) {
  ArenaAllocator arena(1024);
  const uint64_t a = *arena.allocate(256);
  const uint64_t b = *arena.allocate(256);
  const uint64_t c = *arena.allocate(512);
  EXPECT_FALSE(arena.allocate(1).has_value());
  arena.release(a, 256);
  arena.release(c, 512);
  EXPECT_EQ(arena.largest_free_range(), 512u);
  arena.release(b, 256);
  EXPECT_EQ(arena.largest_free_range(), 1024u);
}

}  // namespace
}  // namespace peerserve
