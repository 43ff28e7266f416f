// SsdTier: round trips, recovery after a restart, checksum rejection, LRU eviction past
// capacity, tenant quotas, interrupted writes and concurrent writers of one key.
#include "cache/ssd_tier.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

using testing::block_matches;
using testing::make_block;
using testing::ScratchDir;

std::unique_ptr<SsdTier> open_tier(const std::filesystem::path& dir, uint64_t capacity,
                                   std::map<std::string, uint64_t> quotas = {}) {
  auto tier =
      SsdTier::open({.dir = dir, .capacity_bytes = capacity, .tenant_capacity = std::move(quotas)});
  PS_CHECK(tier.ok()) << tier.status().to_string();
  return std::move(tier).value();
}

PoolKey key(uint64_t hash, std::string tenant = "t") {
  return PoolKey{std::move(tenant), hash};
}

std::optional<std::vector<std::byte>> read(SsdTier& tier, const PoolKey& k) {
  std::vector<std::byte> out;
  Result<bool> hit = tier.get(k, [&](size_t size) {
    out.resize(size);
    return std::span<std::byte>(out);
  });
  PS_CHECK(hit.ok()) << hit.status().to_string();
  if (!*hit) return std::nullopt;
  return out;
}

// File bytes of a block of `payload` bytes for tenant "t".
constexpr uint64_t file_bytes(uint64_t payload) {
  return SsdTier::kHeaderBytes + 1 + payload;
}

TEST(SsdTierTest, RoundTripAndRecoveryAfterRestart) {
  ScratchDir dir("ssd");
  {
    auto tier = open_tier(dir.path(), 1 << 20);
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(tier->put(key(i), make_block(i, 1000 + i)).ok());
    ASSERT_TRUE(tier->put(key(3, "u"), make_block(33, 500)).ok());
    EXPECT_TRUE(block_matches(*read(*tier, key(3)), 3));
  }
  auto tier = open_tier(dir.path(), 1 << 20);
  EXPECT_EQ(tier->recovery().blocks, 11u);
  for (uint64_t i = 0; i < 10; ++i) {
    auto block = read(*tier, key(i));
    ASSERT_TRUE(block.has_value()) << i;
    EXPECT_EQ(block->size(), 1000 + i);
    EXPECT_TRUE(block_matches(*block, i));
  }
  EXPECT_TRUE(block_matches(*read(*tier, key(3, "u")), 33));
  EXPECT_EQ(tier->size_of(key(9)), 1009u);
  EXPECT_EQ(tier->stats().used_bytes, 10 * file_bytes(1000) + 45 + SsdTier::kHeaderBytes + 1 + 500);
}

// --ssd-sync: each write is synced with its folder, and the tier's folder too when a tenant's
// folder is new (whether the entries survive a power cut is not observable here; this runs
// the path and checks nothing is refused or lost across a restart).
TEST(SsdTierTest, SyncedWritesOfNewTenantsRoundTrip) {
  ScratchDir dir("ssd-sync");
  {
    auto tier = SsdTier::open(
        {.dir = dir.path(), .capacity_bytes = 1 << 20, .tenant_capacity = {}, .sync_writes = true});
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    ASSERT_TRUE((*tier)->put(key(1, "a"), make_block(1, 300)).ok());
    ASSERT_TRUE((*tier)->put(key(2, "b"), make_block(2, 300)).ok());
    ASSERT_TRUE((*tier)->put(key(1, "a"), make_block(3, 300)).ok());  // replaced
  }
  auto tier = open_tier(dir.path(), 1 << 20);
  EXPECT_EQ(tier->recovery().blocks, 2u);
  EXPECT_TRUE(block_matches(*read(*tier, key(1, "a")), 3));
  EXPECT_TRUE(block_matches(*read(*tier, key(2, "b")), 2));
}

TEST(SsdTierTest, CorruptPayloadIsAMissCountedAndRemoved) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 1 << 20);
  ASSERT_TRUE(tier->put(key(1), make_block(1, 4096)).ok());
  ASSERT_TRUE(tier->put(key(2), make_block(2, 4096)).ok());
  {
    std::fstream f(tier->block_path(key(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(SsdTier::kHeaderBytes + 1 + 2000));
    f.put('\x5a' ^ static_cast<char>(make_block(1, 4096)[2000]));
  }
  EXPECT_FALSE(read(*tier, key(1)).has_value());
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_FALSE(std::filesystem::exists(tier->block_path(key(1))));
  EXPECT_FALSE(tier->size_of(key(1)).has_value());
  EXPECT_TRUE(block_matches(*read(*tier, key(2)), 2));
}

TEST(SsdTierTest, ACorruptFileIsRemovedButNotTheNewerCopyWrittenMeanwhile) {
  // The read opens the corrupt file; a put of the same key lands (from inside the read's
  // sink) before the checksum fails. Only the corrupt file may go, not the new good copy.
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 1 << 20);
  ASSERT_TRUE(tier->put(key(1), make_block(1, 4096)).ok());
  {
    std::fstream f(tier->block_path(key(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(SsdTier::kHeaderBytes + 1 + 2000));
    f.put('\x5a' ^ static_cast<char>(make_block(1, 4096)[2000]));
  }
  std::vector<std::byte> out;
  Result<bool> hit = tier->get(key(1), [&](size_t size) {
    EXPECT_TRUE(tier->put(key(1), make_block(7, 4096)).ok());
    out.resize(size);
    return std::span<std::byte>(out);
  });
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(*hit);  // the bytes it read were corrupt
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  auto again = read(*tier, key(1));
  ASSERT_TRUE(again.has_value()) << "the newer copy was deleted with the corrupt one";
  EXPECT_TRUE(block_matches(*again, 7));
}

TEST(SsdTierTest, CorruptHeaderIsAMiss) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 1 << 20);
  ASSERT_TRUE(tier->put(key(1), make_block(1, 256)).ok());
  {
    std::fstream f(tier->block_path(key(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24);  // payload size field
    f.put('\x7f');
  }
  EXPECT_FALSE(read(*tier, key(1)).has_value());
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
}

TEST(SsdTierTest, RecoveryDropsTruncatedMisnamedAndTemporaryFiles) {
  ScratchDir dir("ssd");
  std::filesystem::path good, truncated;
  {
    auto tier = open_tier(dir.path(), 1 << 20);
    ASSERT_TRUE(tier->put(key(1), make_block(1, 512)).ok());
    ASSERT_TRUE(tier->put(key(2), make_block(2, 512)).ok());
    good = tier->block_path(key(1));
    truncated = tier->block_path(key(2));
  }
  std::filesystem::resize_file(truncated, 300);
  // A file renamed to another key's name: its header names key 1, its name key 7.
  std::filesystem::copy_file(good, dir.path() / "t" / "0000000000000007.kvb");
  std::ofstream(dir.path() / "t" / ".tmp-0000000000000003-1-1") << "half a block";
  std::ofstream(dir.path() / "t" / "README") << "not a block";
  auto tier = open_tier(dir.path(), 1 << 20);
  EXPECT_EQ(tier->recovery().blocks, 1u);
  EXPECT_EQ(tier->recovery().bad_files_removed, 2u);
  EXPECT_EQ(tier->recovery().temp_files_removed, 1u);
  EXPECT_TRUE(block_matches(*read(*tier, key(1)), 1));
  EXPECT_FALSE(read(*tier, key(2)).has_value());
  EXPECT_FALSE(read(*tier, key(7)).has_value());
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "t" / "README"));  // not ours: left alone
}

// Only regular files can be the tier's: a link, a folder or a FIFO under a block's or a temp
// file's name is left alone (recovery removed each as a bad file).
TEST(SsdTierTest, RecoveryLeavesWhatIsNotARegularFile) {
  ScratchDir dir("ssd");
  ASSERT_TRUE(open_tier(dir.path(), 1 << 20)->put(key(1), make_block(1, 512)).ok());
  const std::filesystem::path t = dir.path() / "t";
  std::filesystem::create_symlink("/dev/zero", t / "0000000000000009.kvb");
  std::filesystem::create_directory(t / "000000000000000a.kvb");
  ASSERT_EQ(::mkfifo((t / ".tmp-0000000000000003-1-1").c_str(), 0644), 0);
  auto tier = open_tier(dir.path(), 1 << 20);
  EXPECT_EQ(tier->recovery().blocks, 1u);
  EXPECT_EQ(tier->recovery().bad_files_removed, 0u);
  EXPECT_EQ(tier->recovery().temp_files_removed, 0u);
  EXPECT_TRUE(std::filesystem::is_symlink(t / "0000000000000009.kvb"));
  EXPECT_TRUE(std::filesystem::is_directory(t / "000000000000000a.kvb"));
  EXPECT_TRUE(std::filesystem::is_fifo(t / ".tmp-0000000000000003-1-1"));
}

// Two tiers on one folder would delete each other's writes in flight and evict each other's
// files: the second is refused while the first is open, and opens once it is closed.
TEST(SsdTierTest, AFolderServesOneTierAtATime) {
  ScratchDir dir("ssd");
  auto first = open_tier(dir.path(), 1 << 20);
  auto second =
      SsdTier::open({.dir = dir.path(), .capacity_bytes = 1 << 20, .tenant_capacity = {}});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another process"), std::string::npos)
      << second.status().to_string();
  first.reset();
  EXPECT_TRUE(
      SsdTier::open({.dir = dir.path(), .capacity_bytes = 1 << 20, .tenant_capacity = {}}).ok());
}

TEST(SsdTierTest, EvictsLeastRecentlyUsedPastCapacity) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 4 * file_bytes(1000));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(tier->put(key(i), make_block(i, 1000)).ok());
  ASSERT_TRUE(read(*tier, key(0)).has_value());  // 1 is now the least recently used
  ASSERT_TRUE(tier->put(key(4), make_block(4, 1000)).ok());
  EXPECT_FALSE(tier->size_of(key(1)).has_value());
  EXPECT_FALSE(std::filesystem::exists(tier->block_path(key(1))));
  EXPECT_TRUE(tier->size_of(key(0)).has_value());
  EXPECT_EQ(tier->stats().evictions, 1u);
  for (uint64_t i = 5; i < 50; ++i) {
    ASSERT_TRUE(tier->put(key(i), make_block(i, 1000)).ok());
    ASSERT_LE(tier->stats().used_bytes, 4 * file_bytes(1000));
  }
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "t")) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 4u);
}

TEST(SsdTierTest, RecoveryOverASmallerCapacityEvictsTheOldest) {
  ScratchDir dir("ssd");
  {
    auto tier = open_tier(dir.path(), 1 << 20);
    for (uint64_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(tier->put(key(i), make_block(i, 1000)).ok());
      // Distinct modification times order the blocks for LRU after the restart.
      std::filesystem::last_write_time(
          tier->block_path(key(i)),
          std::filesystem::file_time_type::clock::now() + std::chrono::seconds(i));
    }
  }
  auto tier = open_tier(dir.path(), 3 * file_bytes(1000));
  EXPECT_EQ(tier->recovery().blocks, 3u);
  EXPECT_EQ(tier->recovery().evicted_over_capacity, 3u);
  for (uint64_t i = 3; i < 6; ++i) EXPECT_TRUE(tier->size_of(key(i)).has_value()) << i;
}

TEST(SsdTierTest, TenantQuotaEvictsOnlyThatTenant) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 1 << 20, {{"t", 2 * file_bytes(1000)}});
  ASSERT_TRUE(tier->put(key(1, "other"), make_block(1, 1000)).ok());
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(tier->put(key(i), make_block(i, 1000)).ok());
  EXPECT_EQ(tier->stats().tenant_used_bytes.at("t"), 2 * file_bytes(1000));
  EXPECT_TRUE(tier->size_of(key(1, "other")).has_value());
  EXPECT_TRUE(tier->size_of(key(4)).has_value());
  EXPECT_FALSE(tier->size_of(key(0)).has_value());
}

TEST(SsdTierTest, ConcurrentWritersOfOneKeyLeaveOneCompleteBlock) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 1 << 24);
  constexpr size_t kSize = 64 * 1024;
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> writers;
  for (uint64_t w = 1; w <= 3; ++w) {
    writers.emplace_back([&, w] {
      const auto block = make_block(w, kSize);
      for (int i = 0; i < 60; ++i) EXPECT_TRUE(tier->put(key(42), block).ok());
    });
  }
  std::thread reader([&] {
    do {
      auto block = read(*tier, key(42));
      if (block && !block_matches(*block, 1) && !block_matches(*block, 2) &&
          !block_matches(*block, 3)) {
        ++torn;
      }
    } while (!stop);
  });
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
  EXPECT_EQ(tier->stats().blocks, 1u);
  EXPECT_EQ(tier->stats().used_bytes, file_bytes(kSize));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "t")) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u);  // no temporary file left behind
}

TEST(SsdTierTest, BadInputIsAnErrorNamingIt) {
  ScratchDir dir("ssd");
  auto tier = open_tier(dir.path(), 4096);
  EXPECT_EQ(tier->put(key(1), {}).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tier->put(key(1), make_block(1, 8192)).message().find("more than the capacity"),
            std::string::npos);
  EXPECT_FALSE(tier->put(key(1, "a b"), make_block(1, 8)).ok());
  SsdTierOptions zero_capacity;
  zero_capacity.dir = dir.path();
  EXPECT_FALSE(SsdTier::open(zero_capacity).ok());
  ASSERT_TRUE(tier->put(key(1), make_block(1, 64)).ok());
  std::vector<std::byte> small(10);
  EXPECT_EQ(tier->get(key(1), sink_into(small)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace peerserve
