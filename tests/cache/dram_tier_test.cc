// DramTier: round trips, LRU eviction, tenant quotas, two-phase writes, pinned reads and
// concurrent writers of one key.
#include "cache/dram_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

using testing::block_matches;
using testing::make_block;

std::unique_ptr<DramTier> make_tier(uint64_t capacity,
                                    std::map<std::string, uint64_t> quotas = {}) {
  auto tier = DramTier::create({.capacity_bytes = capacity, .tenant_capacity = std::move(quotas)});
  PS_CHECK(tier.ok()) << tier.status().to_string();
  return std::move(tier).value();
}

PoolKey key(uint64_t hash, std::string tenant = "t") {
  return PoolKey{std::move(tenant), hash};
}

// Reads a block of unknown size; nullopt on a miss.
std::optional<std::vector<std::byte>> read(DramTier& tier, const PoolKey& k) {
  std::vector<std::byte> out;
  Result<bool> hit = tier.get(k, [&](size_t size) {
    out.resize(size);
    return std::span<std::byte>(out);
  });
  PS_CHECK(hit.ok()) << hit.status().to_string();
  if (!*hit) return std::nullopt;
  return out;
}

TEST(DramTierTest, RoundTripOfVariableSizes) {
  auto tier = make_tier(1 << 20);
  for (uint64_t i = 1; i <= 20; ++i) {
    ASSERT_TRUE(tier->put(key(i), make_block(i, 100 * i + 7)).ok());
  }
  for (uint64_t i = 1; i <= 20; ++i) {
    auto block = read(*tier, key(i));
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ(block->size(), 100 * i + 7);
    EXPECT_TRUE(block_matches(*block, i));
    EXPECT_EQ(tier->size_of(key(i)), 100 * i + 7);
  }
  EXPECT_FALSE(read(*tier, key(99)).has_value());
  EXPECT_FALSE(read(*tier, key(1, "other")).has_value());  // tenants are separate
  const TierStats s = tier->stats();
  EXPECT_EQ(s.hits, 20u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.blocks, 20u);
}

TEST(DramTierTest, EvictsLeastRecentlyUsedAndStaysWithinCapacity) {
  auto tier = make_tier(4 * 1024);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(tier->put(key(i), make_block(i, 1024)).ok());
  ASSERT_TRUE(read(*tier, key(0)).has_value());  // 0 is now the most recent; 1 the oldest
  ASSERT_TRUE(tier->put(key(4), make_block(4, 1024)).ok());
  EXPECT_FALSE(tier->size_of(key(1)).has_value());
  EXPECT_TRUE(tier->size_of(key(0)).has_value());
  EXPECT_EQ(tier->stats().evictions, 1u);
  for (uint64_t i = 5; i < 200; ++i) {
    ASSERT_TRUE(tier->put(key(i), make_block(i, 300 + i * 13 % 900)).ok());
    ASSERT_LE(tier->stats().used_bytes, 4u * 1024);
  }
  EXPECT_TRUE(block_matches(*read(*tier, key(199)), 199));
}

TEST(DramTierTest, TenantQuotaEvictsOnlyThatTenant) {
  auto tier = make_tier(64 * 1024, {{"small", 2048}});
  ASSERT_TRUE(tier->put(key(1, "big"), make_block(1, 1024)).ok());
  for (uint64_t i = 0; i < 6; ++i)
    ASSERT_TRUE(tier->put(key(i, "small"), make_block(i, 1024)).ok());
  const TierStats s = tier->stats();
  EXPECT_EQ(s.tenant_used_bytes.at("small"), 2048u);
  EXPECT_TRUE(tier->size_of(key(1, "big")).has_value());
  EXPECT_TRUE(tier->size_of(key(5, "small")).has_value());
  EXPECT_FALSE(tier->size_of(key(0, "small")).has_value());
  Status too_big = tier->put(key(9, "small"), make_block(9, 4096));
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("namespace's capacity"), std::string::npos);
}

TEST(DramTierTest, ReservationIsInvisibleUntilCommitAndFreedOnAbort) {
  auto tier = make_tier(2048);
  {
    Result<WriteReservation> r = tier->reserve(key(1), 2048);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(read(*tier, key(1)).has_value());
    EXPECT_EQ(tier->stats().used_bytes, 2048u);
    // No room for anything else while the write is in progress.
    EXPECT_EQ(tier->put(key(2), make_block(2, 64)).code(), StatusCode::kResourceExhausted);
  }  // dropped without commit
  EXPECT_EQ(tier->stats().used_bytes, 0u);
  Result<WriteReservation> r = tier->reserve(key(1), 100);
  ASSERT_TRUE(r.ok());
  const auto block = make_block(1, 100);
  std::copy(block.begin(), block.end(), r->bytes().begin());
  r->commit();
  EXPECT_TRUE(block_matches(*read(*tier, key(1)), 1));
}

TEST(DramTierTest, PinnedBlockSurvivesEvictionAndReplacementDuringTheCopy) {
  auto tier = make_tier(3 * 1024);
  ASSERT_TRUE(tier->put(key(1), make_block(1, 1024)).ok());
  std::vector<std::byte> out;
  Result<bool> hit = tier->get(key(1), [&](size_t size) {
    // While key 1 is pinned: replace it, remove it, and fill the tier with other blocks.
    EXPECT_TRUE(tier->put(key(1), make_block(100, 1024)).ok());
    EXPECT_TRUE(tier->remove(key(1)));
    for (uint64_t i = 2; i < 10; ++i) (void)tier->put(key(i), make_block(i, 1024));
    out.resize(size);
    return std::span<std::byte>(out);
  });
  ASSERT_TRUE(hit.ok());
  ASSERT_TRUE(*hit);
  EXPECT_TRUE(block_matches(out, 1));  // the original bytes, untouched
  EXPECT_FALSE(read(*tier, key(1)).has_value());
  EXPECT_LE(tier->stats().used_bytes, 3u * 1024);
}

TEST(DramTierTest, BadInputIsAnErrorNamingIt) {
  auto tier = make_tier(1024);
  EXPECT_EQ(tier->put(key(1), {}).code(), StatusCode::kInvalidArgument);
  Status huge = tier->put(key(1), make_block(1, 4096));
  EXPECT_NE(huge.message().find("larger than the tier"), std::string::npos);
  EXPECT_NE(tier->put(key(1, "../x"), make_block(1, 8)).message().find("'../x'"),
            std::string::npos);
  ASSERT_TRUE(tier->put(key(1), make_block(1, 64)).ok());
  std::vector<std::byte> small(10);
  Result<bool> mismatch = tier->get(key(1), sink_into(small));
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("64 bytes"), std::string::npos);
  EXPECT_FALSE(DramTier::create(DramTierOptions{}).ok());  // capacity 0
}

TEST(DramTierTest, ConcurrentWritersOfOneKeyNeverTearABlock) {
  auto tier = make_tier(256 * 1024);
  constexpr size_t kSize = 8192;
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (uint64_t w = 1; w <= 3; ++w) {
    threads.emplace_back([&, w] {
      const auto block = make_block(w, kSize);
      for (int i = 0; i < 400; ++i) EXPECT_TRUE(tier->put(key(42), block).ok());
    });
  }
  threads.emplace_back([&] {
    do {  // at least one read after the writers finished
      auto block = read(*tier, key(42));
      if (!block) continue;
      ++hits;
      if (!block_matches(*block, 1) && !block_matches(*block, 2) && !block_matches(*block, 3)) {
        ++torn;
      }
    } while (!stop);
  });
  for (size_t i = 0; i < 3; ++i) threads[i].join();
  stop = true;
  threads[3].join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(tier->stats().blocks, 1u);
  EXPECT_EQ(tier->stats().used_bytes, kSize);
}

}  // namespace
}  // namespace peerserve
