// TieredBlockStore: write-through to SSD, DRAM eviction served from SSD, promotion, restart.
#include "cache/tiered_block_store.h"

#include <gtest/gtest.h>

#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

using testing::block_matches;
using testing::make_block;
using testing::ScratchDir;

TieredBlockStoreOptions store_options(uint64_t dram_bytes,
                                      const std::filesystem::path& ssd_dir = {},
                                      uint64_t ssd_bytes = 0) {
  TieredBlockStoreOptions options;
  options.dram_bytes = dram_bytes;
  options.ssd_dir = ssd_dir.string();
  options.ssd_bytes = ssd_bytes;
  return options;
}

std::unique_ptr<TieredBlockStore> open_store(const TieredBlockStoreOptions& options) {
  auto store = TieredBlockStore::open(options);
  PS_CHECK(store.ok()) << store.status().to_string();
  return std::move(store).value();
}

std::optional<std::vector<std::byte>> read(TieredBlockStore& store, const PoolKey& k) {
  std::vector<std::byte> out;
  Result<bool> hit = store.get(k, [&](size_t size) {
    out.resize(size);
    return std::span<std::byte>(out);
  });
  PS_CHECK(hit.ok()) << hit.status().to_string();
  if (!*hit) return std::nullopt;
  return out;
}

TEST(TieredBlockStoreTest, DramOverflowIsServedFromSsdAndPromoted) {
  ScratchDir dir("tiered");
  auto store = open_store(store_options(8 * 1024, dir.path(), 1 << 20));
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(store->put({"t", i}, make_block(i, 1024)).ok());
  }
  PoolStats s = store->stats();
  EXPECT_EQ(s.dram.blocks, 8u);
  EXPECT_EQ(s.dram.evictions, 32u);
  ASSERT_TRUE(s.ssd.has_value());
  EXPECT_EQ(s.ssd->blocks, 40u);
  // Every block comes back: the oldest from SSD (then promoted into DRAM).
  for (uint64_t i = 0; i < 40; ++i) {
    auto block = read(*store, {"t", i});
    ASSERT_TRUE(block.has_value()) << i;
    EXPECT_TRUE(block_matches(*block, i));
  }
  s = store->stats();
  EXPECT_EQ(s.hits, 40u);
  EXPECT_EQ(s.ssd->hits, 40u);  // each read found it evicted from DRAM by the reads before
  const uint64_t ssd_hits = s.ssd->hits;
  ASSERT_TRUE(read(*store, {"t", 39}).has_value());  // promoted: now a DRAM hit
  EXPECT_EQ(store->stats().ssd->hits, ssd_hits);
}

TEST(TieredBlockStoreTest, APromotionNeverOverwritesANewerWrite) {
  // A read served from SSD is promoted into DRAM. A put of the same key that lands while the
  // read is on its way (here: from inside the read's sink, after the old file was opened)
  // must win: the promotion of the older bytes is dropped, and so is one after a remove.
  ScratchDir dir("tiered_race");
  auto store = open_store(store_options(1024, dir.path(), 1 << 20));  // DRAM: one block
  const PoolKey key{"t", 1}, other{"t", 2};
  for (const bool remove : {false, true}) {
    SCOPED_TRACE(remove ? "remove during the read" : "put during the read");
    ASSERT_TRUE(store->put(key, make_block(10, 1024)).ok());
    ASSERT_TRUE(store->put(other, make_block(20, 1024)).ok());  // evicts `key` from DRAM
    std::vector<std::byte> got;
    Result<bool> hit = store->get(key, [&](size_t size) {
      if (remove) {
        store->remove(key);
      } else {
        EXPECT_TRUE(store->put(key, make_block(11, 1024)).ok());
      }
      got.resize(size);
      return std::span<std::byte>(got);
    });
    ASSERT_TRUE(hit.ok()) << hit.status().to_string();
    ASSERT_TRUE(*hit);
    EXPECT_TRUE(block_matches(got, 10));  // the bytes of the file it opened
    auto after = read(*store, key);
    if (remove) {
      EXPECT_FALSE(after.has_value()) << "a removed block came back";
    } else {
      ASSERT_TRUE(after.has_value());
      EXPECT_TRUE(block_matches(*after, 11)) << "the older bytes overwrote the newer write";
    }
  }
}

TEST(TieredBlockStoreTest, BlocksSurviveARestart) {
  ScratchDir dir("tiered");
  const TieredBlockStoreOptions options = store_options(1 << 20, dir.path(), 1 << 20);
  {
    auto store = open_store(options);
    ASSERT_TRUE(store->put({"t", 5}, make_block(5, 3000)).ok());
  }
  auto store = open_store(options);
  EXPECT_EQ(store->size_of({"t", 5}), 3000u);
  EXPECT_TRUE(block_matches(*read(*store, {"t", 5}), 5));
  EXPECT_TRUE(store->remove({"t", 5}));
  EXPECT_FALSE(read(*store, {"t", 5}).has_value());
  EXPECT_FALSE(store->remove({"t", 5}));
}

TEST(TieredBlockStoreTest, DramOnlyStoreForgetsEvictedBlocks) {
  auto store = open_store(store_options(2048));
  EXPECT_FALSE(store->has_ssd());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(store->put({"t", i}, make_block(i, 1024)).ok());
  EXPECT_FALSE(read(*store, {"t", 0}).has_value());
  EXPECT_TRUE(read(*store, {"t", 3}).has_value());
  EXPECT_FALSE(store->stats().ssd.has_value());
}

TEST(TieredBlockStoreTest, BlockLargerThanDramIsServedFromSsd) {
  ScratchDir dir("tiered");
  auto store = open_store(store_options(4096, dir.path(), 1 << 20));
  ASSERT_TRUE(store->put({"t", 1}, make_block(1, 10000)).ok());
  EXPECT_TRUE(block_matches(*read(*store, {"t", 1}), 1));
  EXPECT_EQ(store->stats().ssd->hits, 1u);
  EXPECT_EQ(store->stats().dram.blocks, 0u);
}

TEST(TieredBlockStoreTest, RefusedPutLeavesNoOlderVersion) {
  ScratchDir dir("tiered");
  auto store = open_store(store_options(1 << 20, dir.path(), 4096));
  ASSERT_TRUE(store->put({"t", 1}, make_block(1, 1000)).ok());
  EXPECT_FALSE(store->put({"t", 1}, make_block(2, 8000)).ok());  // larger than the SSD tier
  EXPECT_FALSE(read(*store, {"t", 1}).has_value());
  EXPECT_EQ(store->stats().put_errors, 1u);
}

}  // namespace
}  // namespace peerserve
