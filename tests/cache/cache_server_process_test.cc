// End-to-end: real `peerserve cache-server` processes on loopback, driven by PoolClient.
// Faults: kill -9 mid-load, SIGSTOP (a hung member), restart on the same SSD folder,
// DRAM and SSD past capacity, a corrupted SSD file, namespaces, concurrent writers of one
// key, and bytes that are not the protocol.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "cache/pool_client.h"
#include "cache/ssd_tier.h"
#include "tests/cache/block_test_util.h"
#include "tests/cache/cache_server_process.h"

namespace peerserve {
namespace {

using std::chrono::milliseconds;
using testing::block_matches;
using testing::CacheServerProcess;
using testing::make_block;
using testing::ScratchDir;

constexpr size_t kBlock = 46080;  // one 16-token block of the mini preset (5 x 16 x 288 x 2)
constexpr milliseconds kTimeout{3000};

PoolClientOptions fast_retry_options() {
  PoolClientOptions options;
  options.connect_timeout = milliseconds(300);
  options.down_backoff_initial = milliseconds(50);
  options.down_backoff_max = milliseconds(200);
  return options;
}

std::unique_ptr<PoolClient> connect(const std::string& members,
                                    PoolClientOptions options = fast_retry_options()) {
  auto client = PoolClient::connect(members, options);
  PS_CHECK(client.ok()) << client.status().to_string();
  return std::move(client).value();
}

std::vector<PoolKey> make_keys(int n, const std::string& tenant = "t", uint64_t base = 1) {
  std::vector<PoolKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back({tenant, base + static_cast<uint64_t>(i) * 104729});
  return keys;
}

// Puts block seed i under keys[i]; returns the statuses.
std::vector<Status> put_blocks(PoolClient& client, const std::vector<PoolKey>& keys,
                               uint64_t seed_base = 0) {
  std::vector<std::vector<std::byte>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(make_block(seed_base + i, kBlock));
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  return client.put(keys, views, kTimeout);
}

struct ReadCounts {
  int hits = 0;
  int misses = 0;
  int errors = 0;
  int wrong = 0;  // hits with bytes other than the ones written: must never happen
};

ReadCounts read_blocks(PoolClient& client, const std::vector<PoolKey>& keys, uint64_t seed_base = 0,
                       std::vector<bool>* hit_mask = nullptr) {
  std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<BlockSink> sinks;
  for (auto& b : out) sinks.push_back(sink_into(b));
  const std::vector<BlockLookup> results = client.get(keys, sinks, kTimeout);
  ReadCounts counts;
  if (hit_mask) hit_mask->assign(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    switch (results[i].kind) {
      case BlockLookup::Kind::kHit:
        ++counts.hits;
        if (!block_matches(out[i], seed_base + i)) ++counts.wrong;
        if (hit_mask) (*hit_mask)[i] = true;
        break;
      case BlockLookup::Kind::kMiss:
        ++counts.misses;
        break;
      case BlockLookup::Kind::kError:
        ++counts.errors;
        break;
    }
  }
  return counts;
}

PoolStats server_stats(PoolClient& client) {
  auto stats = client.member_stats(kTimeout);
  PS_CHECK_EQ(stats.size(), 1u);
  PS_CHECK(stats[0].stats.ok()) << stats[0].stats.status().to_string();
  return *stats[0].stats;
}

TEST(CacheServerProcessTest, HelpAndBadFlags) {
  const std::string help =
      testing::peerserve_binary() + " cache-server --help 2>&1 | grep -c -- '--ssd-dir'";
  EXPECT_EQ(std::system(help.c_str()), 0);
  CacheServerProcess bad;
  EXPECT_FALSE(bad.start({"--dram", "12Q"}));
  EXPECT_NE(bad.log().find("--dram '12Q'"), std::string::npos) << bad.log();
  CacheServerProcess half_ssd;
  EXPECT_FALSE(half_ssd.start({"--dram", "1M", "--ssd-dir", "/tmp/x"}));
  EXPECT_NE(half_ssd.log().find("--ssd-dir and --ssd"), std::string::npos) << half_ssd.log();
  // A bound no block could use over gRPC, and whose puts could ask for any allocation (a
  // put declaring 900 GiB ended the server with std::bad_alloc).
  CacheServerProcess huge_blocks;
  EXPECT_FALSE(huge_blocks.start({"--dram", "1M", "--max-block-bytes", "1T"}));
  EXPECT_NE(huge_blocks.log().find("--max-block-bytes 1T: expected 1 .. 63M"), std::string::npos)
      << huge_blocks.log();
}

TEST(CacheServerProcessTest, KillNineMidLoadThenRestartOnTheSameSsdDir) {
  ScratchDir dir("cache_server");
  const std::vector<std::string> args = {"--dram", "64M", "--ssd-dir", dir.path().string(),
                                         "--ssd",  "256M"};
  CacheServerProcess server;
  ASSERT_TRUE(server.start(args)) << server.log();
  auto client = connect(server.address());
  const auto keys = make_keys(64);
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok()) << s.to_string();
  ReadCounts first = read_blocks(*client, keys);
  EXPECT_EQ(first.hits, 64);
  EXPECT_EQ(first.wrong, 0);

  // Load from two threads while the server is killed: every call returns, nothing wrong.
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, errors{0}, calls{0}, misses{0};
  std::vector<std::thread> loaders;
  for (int t = 0; t < 2; ++t) {
    loaders.emplace_back([&] {
      auto own = connect(server.address());
      while (!stop) {
        ReadCounts r = read_blocks(*own, keys);
        wrong += r.wrong;
        errors += r.errors;
        misses += r.misses;
        ++calls;
      }
    });
  }
  while (calls < 4) std::this_thread::sleep_for(milliseconds(5));
  server.kill_hard();
  const int calls_at_kill = calls;
  while (calls < calls_at_kill + 4) std::this_thread::sleep_for(milliseconds(5));
  stop = true;
  for (auto& l : loaders) l.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);  // a dead member reads as misses
  EXPECT_GT(misses.load(), 0);

  ReadCounts dead = read_blocks(*client, keys);
  EXPECT_EQ(dead.misses, 64);
  EXPECT_EQ(dead.errors, 0);
  EXPECT_GE(client->counters().unavailable_misses, 64u);

  // Restart on the same port and folder: the blocks come back from SSD.
  CacheServerProcess restarted;
  ASSERT_TRUE(restarted.start(args, server.port())) << restarted.log();
  EXPECT_NE(restarted.log().find("recovered 64 blocks"), std::string::npos) << restarted.log();
  ReadCounts back;
  for (int attempt = 0; attempt < 100 && back.hits < 64; ++attempt) {
    std::this_thread::sleep_for(milliseconds(100));  // backoff and reconnect
    back = read_blocks(*client, keys);
  }
  EXPECT_EQ(back.hits, 64);
  EXPECT_EQ(back.wrong, 0);
  EXPECT_EQ(restarted.terminate(), 0);
}

TEST(CacheServerProcessTest, HungServerIsAMissAfterTheDeadline) {
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "16M"})) << server.log();
  auto client = connect(server.address());
  const auto keys = make_keys(8);
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok());
  server.pause();  // SIGSTOP: the connection stays open, nothing answers
  std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<BlockSink> sinks;
  for (auto& b : out) sinks.push_back(sink_into(b));
  const std::vector<BlockLookup> results = client->get(keys, sinks, milliseconds(500));
  for (const BlockLookup& r : results) EXPECT_EQ(r.kind, BlockLookup::Kind::kMiss);
  server.resume();
  ReadCounts again;
  for (int attempt = 0; attempt < 50 && again.hits < 8; ++attempt) {
    std::this_thread::sleep_for(milliseconds(100));
    again = read_blocks(*client, keys);
  }
  EXPECT_EQ(again.hits, 8);
}

TEST(CacheServerProcessTest, DramPastCapacityEvictsToSsd) {
  ScratchDir dir("cache_server");
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "1M", "--ssd-dir", dir.path().string(), "--ssd", "64M"}))
      << server.log();
  auto client = connect(server.address());
  const auto keys = make_keys(200);  // 9 MB through a 1 MB DRAM tier
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok()) << s.to_string();
  PoolStats s = server_stats(*client);
  EXPECT_GT(s.dram.evictions, 150u);
  EXPECT_LE(s.dram.used_bytes, 1u << 20);
  ASSERT_TRUE(s.ssd.has_value());
  EXPECT_EQ(s.ssd->blocks, 200u);
  ReadCounts r = read_blocks(*client, keys);
  EXPECT_EQ(r.hits, 200);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_GT(server_stats(*client).ssd->hits, 150u);
}

TEST(CacheServerProcessTest, SsdPastCapacityEvictsLeastRecentlyUsed) {
  ScratchDir dir("cache_server");
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "256K", "--ssd-dir", dir.path().string(), "--ssd", "2M"}))
      << server.log();
  auto client = connect(server.address());
  const auto keys = make_keys(100);  // 4.6 MB into a 2 MB SSD tier
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(put_blocks(*client, {keys[i]}, i)[0].ok());
  }
  PoolStats s = server_stats(*client);
  ASSERT_TRUE(s.ssd.has_value());
  EXPECT_LE(s.ssd->used_bytes, 2u << 20);
  EXPECT_GT(s.ssd->evictions, 50u);
  std::vector<bool> hit;
  ReadCounts r = read_blocks(*client, keys, 0, &hit);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_FALSE(hit.front());  // the oldest went first
  EXPECT_TRUE(hit.back());
  EXPECT_EQ(r.hits, static_cast<int>(s.ssd->blocks));
}

TEST(CacheServerProcessTest, CorruptSsdFileIsAMissCounted) {
  ScratchDir dir("cache_server");
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "256K", "--ssd-dir", dir.path().string(), "--ssd", "64M"}))
      << server.log();
  auto client = connect(server.address());
  const auto keys = make_keys(20);  // the first ones leave DRAM
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok());
  const std::filesystem::path file = dir.path() / "t" / (hash_hex(keys[0].hash) + ".kvb");
  ASSERT_TRUE(std::filesystem::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20000);
    f.put('\0');
    f.put('\1');
  }
  std::vector<bool> hit;
  ReadCounts r = read_blocks(*client, keys, 0, &hit);
  EXPECT_FALSE(hit[0]);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_EQ(r.hits, 19);
  EXPECT_EQ(server_stats(*client).ssd->checksum_failures, 1u);
}

TEST(CacheServerProcessTest, NamespacesAreIsolatedAndCapped) {
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "32M", "--namespace-capacity", "small=200K"}))
      << server.log();
  auto client = connect(server.address());
  const auto a_keys = make_keys(10, "tenant-a");
  for (const Status& s : put_blocks(*client, a_keys)) ASSERT_TRUE(s.ok());
  std::vector<PoolKey> b_keys = a_keys;  // the same hashes under another namespace
  for (PoolKey& k : b_keys) k.tenant = "tenant-b";
  EXPECT_EQ(read_blocks(*client, b_keys).hits, 0);
  EXPECT_FALSE(client->remove(b_keys, kTimeout)[0]);  // cannot remove another's block
  EXPECT_EQ(read_blocks(*client, a_keys).hits, 10);
  const auto small_keys = make_keys(20, "small");
  for (const Status& s : put_blocks(*client, small_keys)) ASSERT_TRUE(s.ok());
  PoolStats s = server_stats(*client);
  EXPECT_LE(s.dram.tenant_used_bytes.at("small"), 200u * 1024);
  EXPECT_EQ(read_blocks(*client, a_keys).hits, 10);  // unaffected by the capped namespace
  EXPECT_LE(read_blocks(*client, small_keys).hits, 4);
}

TEST(CacheServerProcessTest, ConcurrentWritersOfOneKey) {
  ScratchDir dir("cache_server");
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "16M", "--ssd-dir", dir.path().string(), "--ssd", "64M"}))
      << server.log();
  const PoolKey key{"t", 77};
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, hits{0};
  std::vector<std::thread> threads;
  for (uint64_t w = 1; w <= 3; ++w) {
    threads.emplace_back([&, w] {
      auto client = connect(server.address());
      const auto block = make_block(w, kBlock);
      for (int i = 0; i < 30; ++i) EXPECT_TRUE(client->put_one(key, block, kTimeout).ok());
    });
  }
  std::thread reader([&] {
    auto client = connect(server.address());
    std::vector<std::byte> out(kBlock);
    do {
      if (!client->get_one(key, out, kTimeout).hit()) continue;
      ++hits;
      if (!block_matches(out, 1) && !block_matches(out, 2) && !block_matches(out, 3)) ++torn;
    } while (!stop);
  });
  for (auto& t : threads) t.join();
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(hits.load(), 0);
  auto client = connect(server.address());
  PoolStats s = server_stats(*client);
  EXPECT_EQ(s.dram.blocks, 1u);
  EXPECT_EQ(s.ssd->blocks, 1u);
}

// Raw bytes on a TCP connection to the server's port.
void send_raw_tcp(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[256];
  (void)::recv(fd, buf, sizeof(buf), 0);  // whatever the server answers, or the timeout
  ::close(fd);
}

TEST(CacheServerProcessTest, BytesThatAreNotTheProtocolLeaveTheServerRunning) {
  CacheServerProcess server;
  ASSERT_TRUE(server.start({"--dram", "16M"})) << server.log();
  send_raw_tcp(server.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  send_raw_tcp(server.port(), std::string(4096, '\xff'));
  // The HTTP/2 preface, then a frame header promising 16 KB of a HEADERS frame, cut short.
  send_raw_tcp(server.port(), std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                                  std::string("\x00\x40\x00\x01\x05\x00\x00\x00\x01xx", 11));
  auto client = connect(server.address());
  const auto keys = make_keys(4);
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(read_blocks(*client, keys).hits, 4);
  EXPECT_TRUE(server.running());
}

TEST(CacheServerProcessTest, TwoServersFormOnePool) {
  CacheServerProcess a, b;
  ASSERT_TRUE(a.start({"--dram", "64M"})) << a.log();
  ASSERT_TRUE(b.start({"--dram", "64M"})) << b.log();
  auto client = connect(a.address() + "," + b.address());
  const auto keys = make_keys(200);
  for (const Status& s : put_blocks(*client, keys)) ASSERT_TRUE(s.ok());
  auto stats = client->member_stats(kTimeout);
  ASSERT_EQ(stats.size(), 2u);
  ASSERT_TRUE(stats[0].stats.ok() && stats[1].stats.ok());
  EXPECT_GT(stats[0].stats->dram.blocks, 40u);
  EXPECT_GT(stats[1].stats->dram.blocks, 40u);
  EXPECT_EQ(stats[0].stats->dram.blocks + stats[1].stats->dram.blocks, 200u);
  // A second client listing the members in the other order finds every block.
  auto reordered = connect(b.address() + "," + a.address());
  EXPECT_EQ(read_blocks(*reordered, keys).hits, 200);
  b.kill_hard();
  std::vector<bool> hit;
  ReadCounts r = read_blocks(*client, keys, 0, &hit);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(r.wrong, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(hit[i], client->owner_of(keys[i]) == a.address()) << i;
  }
}

}  // namespace
}  // namespace peerserve
