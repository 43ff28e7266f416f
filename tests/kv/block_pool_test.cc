#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <random>

#include "kv/prefix_hash.h"

namespace peerserve {
namespace {

BlockPool make_pool(int32_t num_blocks, bool caching = true) {
  auto pool = BlockPool::create(
      {.num_blocks = num_blocks, .block_size = 4, .enable_prefix_caching = caching});
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

std::vector<BlockId> allocate(BlockPool& pool, int32_t n, std::span<const BlockId> shared = {}) {
  auto plan = pool.plan_allocation(shared, n);
  EXPECT_TRUE(plan.has_value());
  return pool.commit(*plan);
}

TEST(BlockPoolTest, RejectsBadOptions) {
  EXPECT_FALSE(BlockPool::create({.num_blocks = 0, .block_size = 4}).ok());
  EXPECT_FALSE(BlockPool::create({.num_blocks = 4, .block_size = 0}).ok());
  auto status = BlockPool::create({.num_blocks = 0, .block_size = 4}).status();
  EXPECT_NE(status.message().find("num_blocks"), std::string::npos) << status.message();
}

TEST(BlockPoolTest, AllocatesInFreeListOrderAndCountsRefs) {
  BlockPool pool = make_pool(4);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  std::vector<BlockId> a = allocate(pool, 3);
  EXPECT_EQ(a, (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.num_used_blocks(), 3);
  EXPECT_FALSE(pool.plan_allocation({}, 2).has_value());  // only one left
  EXPECT_TRUE(pool.plan_allocation({}, 1).has_value());
  pool.release(a);
  EXPECT_EQ(pool.num_free_blocks(), 4);
}

TEST(BlockPoolTest, PlanHasNoSideEffectsUntilCommit) {
  BlockPool pool = make_pool(3);
  auto plan = pool.plan_allocation({}, 2);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(pool.num_free_blocks(), 3);
  // Dropping a plan is the abort: nothing to undo.
  auto plan2 = pool.plan_allocation({}, 3);
  ASSERT_TRUE(plan2.has_value());
  EXPECT_EQ(pool.commit(*plan2).size(), 3u);
  EXPECT_EQ(pool.num_free_blocks(), 0);
}

TEST(BlockPoolTest, StalePlanIsABug) {
  BlockPool pool = make_pool(3);
  auto plan = pool.plan_allocation({}, 1);
  ASSERT_TRUE(plan.has_value());
  allocate(pool, 1);
  EXPECT_DEATH(pool.commit(*plan), "older pool state");
}

TEST(BlockPoolTest, PublishedBlocksAreFoundAndShared) {
  BlockPool pool = make_pool(6);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<BlockHash> chain;
  extend_block_hash_chain(tokens, 4, &chain);
  ASSERT_EQ(chain.size(), 2u);
  std::vector<BlockId> first = allocate(pool, 3);
  EXPECT_TRUE(pool.publish(first[0], chain[0]));
  EXPECT_TRUE(pool.publish(first[1], chain[1]));
  EXPECT_FALSE(pool.publish(first[1], chain[1]));  // already published
  EXPECT_EQ(pool.num_cached_blocks(), 2);

  std::vector<BlockId> hit = pool.match_prefix(chain);
  EXPECT_EQ(hit, (std::vector<BlockId>{first[0], first[1]}));
  // A second sequence shares both blocks and takes one new one.
  std::vector<BlockId> second_new = allocate(pool, 1, hit);
  EXPECT_EQ(pool.ref_count(first[0]), 2);
  EXPECT_EQ(pool.ref_count(first[1]), 2);
  EXPECT_EQ(second_new.size(), 1u);
  // Another block holding the same hash is not published twice.
  EXPECT_FALSE(pool.publish(second_new[0], chain[0]));
}

// Two 16-token blocks found in 3 s (by a meet-in-the-middle search) to share a hash under
// the reversible 64-bit mixer the chain used before SHA-256: a client could have planted KV
// under another client's block hash. The published block must not match the other block.
TEST(BlockPoolTest, BlocksForgedToCollideUnderTheOldMixerDoNotMatch) {
  std::vector<int32_t> a = {3221, 2688, 86255}, b = {3090, 2857, 1000};
  a.resize(16, 7);
  b.resize(16, 7);
  EXPECT_NE(hash_block_tokens(kRootBlockHash, a), hash_block_tokens(kRootBlockHash, b));
  std::vector<BlockHash> chain_a, chain_b;
  extend_block_hash_chain(a, 16, &chain_a);
  extend_block_hash_chain(b, 16, &chain_b);
  BlockPool pool = make_pool(4);
  std::vector<BlockId> blocks = allocate(pool, 1);
  ASSERT_TRUE(pool.publish(blocks[0], chain_a[0]));
  EXPECT_TRUE(pool.match_prefix(chain_b).empty());
}

TEST(BlockPoolTest, DifferentPrefixSameBlockTokensDoNotMatch) {
  // Same second-block tokens behind a different first block: the chain keeps them apart.
  std::vector<BlockHash> a, b;
  extend_block_hash_chain(std::vector<int32_t>{1, 2, 3, 4, 9, 9, 9, 9}, 4, &a);
  extend_block_hash_chain(std::vector<int32_t>{1, 2, 3, 5, 9, 9, 9, 9}, 4, &b);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  EXPECT_EQ(hash_block_tokens(a[0], std::vector<int32_t>{9, 9, 9, 9}), a[1]);
  BlockPool pool = make_pool(4);
  std::vector<BlockId> blocks = allocate(pool, 2);
  ASSERT_TRUE(pool.publish(blocks[0], a[0]));
  ASSERT_TRUE(pool.publish(blocks[1], a[1]));
  EXPECT_TRUE(pool.match_prefix(b).empty());
  EXPECT_EQ(pool.match_prefix(a).size(), 2u);
}

TEST(BlockPoolTest, LookaheadHashesCoverTheTokenAfterTheBlock) {
  // With MTP KV a block's bytes depend on the token after it: it is hashed with that token,
  // only once it exists, and never like a block hashed without it.
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<BlockHash> plain, ahead, short_ahead, other_next;
  extend_block_hash_chain(tokens, 4, kRootBlockHash, &plain);
  extend_block_hash_chain(tokens, 4, kRootBlockHash, &ahead, 1);
  extend_block_hash_chain(std::span(tokens).first(8), 4, kRootBlockHash, &short_ahead, 1);
  extend_block_hash_chain(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 10}, 4, kRootBlockHash,
                          &other_next, 1);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(ahead.size(), 2u);
  ASSERT_EQ(short_ahead.size(), 1u);  // the second block's next token is not there yet
  ASSERT_EQ(other_next.size(), 2u);
  EXPECT_EQ(ahead[0], hash_block_tokens(kRootBlockHash, std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(ahead[1], hash_block_tokens(ahead[0], std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(short_ahead[0], ahead[0]);
  EXPECT_EQ(other_next[0], ahead[0]);
  EXPECT_NE(other_next[1], ahead[1]);
  EXPECT_NE(plain[0], ahead[0]);
  EXPECT_NE(plain[1], ahead[1]);
  // Extending a lookahead chain once more tokens arrived gives the same chain.
  extend_block_hash_chain(tokens, 4, kRootBlockHash, &short_ahead, 1);
  EXPECT_EQ(short_ahead, ahead);
}

TEST(BlockPoolTest, FreedCachedBlocksStayFindableUntilEvictedInLruOrder) {
  BlockPool pool = make_pool(3);
  std::vector<BlockId> blocks = allocate(pool, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.publish(blocks[i], 100 + i));
  // Release last-first: block 2 is least recently released, then 1, then 0.
  pool.release(std::vector<BlockId>{blocks[2], blocks[1], blocks[0]});
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.num_cached_blocks(), 3);
  std::vector<BlockHash> chain0 = {100};
  EXPECT_EQ(pool.match_prefix(chain0).size(), 1u);
  // One new block evicts the least recently released cached block (hash 102).
  std::vector<BlockId> fresh = allocate(pool, 1);
  EXPECT_EQ(fresh[0], blocks[2]);
  EXPECT_EQ(pool.num_cached_blocks(), 2);
  std::vector<BlockHash> h102 = {102}, h101 = {101};
  EXPECT_TRUE(pool.match_prefix(h102).empty());
  EXPECT_EQ(pool.match_prefix(h101).size(), 1u);
  EXPECT_EQ(pool.counters().evictions, 1);
}

TEST(BlockPoolTest, SharingAFreeCachedBlockTakesItOffTheFreeList) {
  BlockPool pool = make_pool(2);
  std::vector<BlockId> blocks = allocate(pool, 1);
  ASSERT_TRUE(pool.publish(blocks[0], 7));
  pool.release(blocks);
  std::vector<BlockHash> chain = {7};
  std::vector<BlockId> hit = pool.match_prefix(chain);
  ASSERT_EQ(hit.size(), 1u);
  // Sharing the cached block and taking 2 new ones needs 3 blocks: impossible.
  EXPECT_FALSE(pool.plan_allocation(hit, 2).has_value());
  auto plan = pool.plan_allocation(hit, 1);
  ASSERT_TRUE(plan.has_value());
  std::vector<BlockId> fresh = pool.commit(*plan);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_NE(fresh[0], hit[0]);
  EXPECT_EQ(pool.ref_count(hit[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
}

TEST(BlockPoolTest, CachingOffNeverPublishes) {
  BlockPool pool = make_pool(2, /*caching=*/false);
  std::vector<BlockId> blocks = allocate(pool, 1);
  EXPECT_FALSE(pool.publish(blocks[0], 5));
  std::vector<BlockHash> chain = {5};
  EXPECT_TRUE(pool.match_prefix(chain).empty());
  // Nothing was looked up, so the hit-rate counters stay at zero (a 0% rate over every
  // prompt would read as a cache that misses; vLLM records nothing either).
  pool.record_lookup(32, 0);
  EXPECT_EQ(pool.counters().prefix_query_tokens, 0);
  EXPECT_EQ(pool.counters().prefix_hit_tokens, 0);
}

TEST(BlockPoolTest, DoubleReleaseIsABug) {
  BlockPool pool = make_pool(2);
  std::vector<BlockId> blocks = allocate(pool, 1);
  pool.release(blocks);
  EXPECT_DEATH(pool.release(blocks), "double release");
}

// A deliberately naive model of the pool (a std::list free list, linear scans) driven by
// the same random operations; every observable must agree.
class NaivePool {
 public:
  explicit NaivePool(int n) : refs_(n, 0) {
    for (int b = 0; b < n; ++b) free_.push_back(b);
  }
  bool can_allocate(const std::vector<int>& shared, int num_new) const {
    int shared_free = 0;
    for (int b : shared) shared_free += refs_[b] == 0;
    return static_cast<int>(free_.size()) - shared_free >= num_new;
  }
  std::vector<int> allocate(const std::vector<int>& shared, int num_new) {
    for (int b : shared) {
      if (refs_[b]++ == 0) free_.remove(b);
    }
    std::vector<int> fresh;
    for (int i = 0; i < num_new; ++i) {
      int b = free_.front();
      free_.pop_front();
      for (auto it = hash_of_.begin(); it != hash_of_.end(); ++it) {
        if (it->second == b) {
          hash_of_.erase(it);
          break;
        }
      }
      refs_[b] = 1;
      fresh.push_back(b);
    }
    return fresh;
  }
  void release(const std::vector<int>& blocks) {
    for (int b : blocks) {
      if (--refs_[b] == 0) free_.push_back(b);
    }
  }
  bool publish(int b, uint64_t h) {
    if (hash_of_.count(h)) return false;
    for (auto& [hh, bb] : hash_of_) {
      if (bb == b) return false;
    }
    hash_of_[h] = b;
    return true;
  }
  std::vector<int> match(const std::vector<uint64_t>& chain) const {
    std::vector<int> out;
    for (uint64_t h : chain) {
      auto it = hash_of_.find(h);
      if (it == hash_of_.end()) break;
      out.push_back(it->second);
    }
    return out;
  }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_cached() const { return static_cast<int>(hash_of_.size()); }

 private:
  std::vector<int> refs_;
  std::list<int> free_;
  std::map<uint64_t, int> hash_of_;
};

TEST(BlockPoolTest, RandomOperationsMatchANaiveModel) {
  constexpr int kBlocks = 12;
  BlockPool pool = make_pool(kBlocks);
  NaivePool naive(kBlocks);
  std::mt19937 rng(1234);
  std::vector<std::vector<BlockId>> owners;  // block lists held by "sequences"
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 || owners.empty()) {
      // Allocate: share a cached prefix of some random hash chain, then new blocks.
      std::vector<uint64_t> chain;
      const int len = static_cast<int>(rng() % 4);
      for (int i = 0; i < len; ++i) chain.push_back(1 + rng() % 6);
      std::vector<BlockId> shared = pool.match_prefix(chain);
      ASSERT_EQ(std::vector<int>(shared.begin(), shared.end()), naive.match(chain));
      const int num_new = static_cast<int>(rng() % 4);
      auto plan = pool.plan_allocation(shared, num_new);
      std::vector<int> shared_int(shared.begin(), shared.end());
      ASSERT_EQ(plan.has_value(), naive.can_allocate(shared_int, num_new));
      if (plan) {
        std::vector<BlockId> fresh = pool.commit(*plan);
        ASSERT_EQ(std::vector<int>(fresh.begin(), fresh.end()),
                  naive.allocate(shared_int, num_new));
        std::vector<BlockId> all = shared;
        all.insert(all.end(), fresh.begin(), fresh.end());
        owners.push_back(all);
      }
    } else if (op == 1) {
      // Release a random owner, last block first.
      const size_t i = rng() % owners.size();
      std::vector<BlockId> blocks(owners[i].rbegin(), owners[i].rend());
      pool.release(blocks);
      naive.release(std::vector<int>(blocks.begin(), blocks.end()));
      owners.erase(owners.begin() + static_cast<long>(i));
    } else {
      // Publish a random held block under a random small hash.
      const auto& blocks = owners[rng() % owners.size()];
      if (blocks.empty()) continue;
      const BlockId b = blocks[rng() % blocks.size()];
      const uint64_t h = 1 + rng() % 6;
      ASSERT_EQ(pool.publish(b, h), naive.publish(b, h));
    }
    ASSERT_EQ(pool.num_free_blocks(), naive.num_free());
    ASSERT_EQ(pool.num_cached_blocks(), naive.num_cached());
  }
}

}  // namespace
}  // namespace peerserve
