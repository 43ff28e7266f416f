// PoolClient over in-process members: placement, fan-out, down members as misses with
// backoff, adding a member, async calls.
#include "cache/pool_client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "cache/local_pool_transport.h"
#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

using std::chrono::milliseconds;
using testing::block_matches;
using testing::make_block;

constexpr milliseconds kTimeout{2000};
constexpr size_t kBlockBytes = 4096;

std::shared_ptr<TieredBlockStore> make_store(uint64_t dram_bytes = 8 << 20) {
  TieredBlockStoreOptions options;
  options.dram_bytes = dram_bytes;
  auto store = TieredBlockStore::open(options);
  PS_CHECK(store.ok());
  return std::shared_ptr<TieredBlockStore>(std::move(store).value());
}

// A local member under another name (the ring places by name); with `down`, gets and puts
// fail as Unavailable while it is set.
class NamedLocalTransport final : public PoolTransport {
 public:
  NamedLocalTransport(std::string name, std::shared_ptr<TieredBlockStore> store,
                      std::shared_ptr<std::atomic<bool>> down = nullptr)
      : name_(std::move(name)), inner_(std::move(store)), down_(std::move(down)) {}
  const std::string& name() const override { return name_; }
  std::vector<BlockLookup> get(std::span<const PoolKey> k, std::span<const BlockSink> s,
                               PoolDeadline d) override {
    if (down_ && *down_) {
      return std::vector<BlockLookup>(k.size(), BlockLookup::failed(unavailable("off")));
    }
    return inner_.get(k, s, d);
  }
  std::vector<Status> put(std::span<const PoolKey> k, std::span<const std::span<const std::byte>> b,
                          PoolDeadline d) override {
    if (down_ && *down_) return std::vector<Status>(k.size(), unavailable("off"));
    return inner_.put(k, b, d);
  }
  Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey> k,
                                                      PoolDeadline d) override {
    return inner_.exists(k, d);
  }
  Result<std::vector<bool>> remove(std::span<const PoolKey> k, PoolDeadline d) override {
    return inner_.remove(k, d);
  }
  Result<PoolStats> stats(PoolDeadline d) override { return inner_.stats(d); }

 private:
  std::string name_;
  LocalPoolTransport inner_;
  std::shared_ptr<std::atomic<bool>> down_;
};

// A member that is down: every call fails with kUnavailable; counts how often it is asked.
class DownTransport final : public PoolTransport {
 public:
  explicit DownTransport(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::vector<BlockLookup> get(std::span<const PoolKey> k, std::span<const BlockSink>,
                               PoolDeadline) override {
    ++calls;
    return std::vector<BlockLookup>(k.size(), BlockLookup::failed(unavailable("down")));
  }
  std::vector<Status> put(std::span<const PoolKey> k, std::span<const std::span<const std::byte>>,
                          PoolDeadline) override {
    ++calls;
    return std::vector<Status>(k.size(), unavailable("down"));
  }
  Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey>,
                                                      PoolDeadline) override {
    ++calls;
    return unavailable("down");
  }
  Result<std::vector<bool>> remove(std::span<const PoolKey>, PoolDeadline) override {
    ++calls;
    return unavailable("down");
  }
  Result<PoolStats> stats(PoolDeadline) override { return unavailable("down"); }

  std::atomic<int> calls{0};

 private:
  std::string name_;
};

// A member that removes every key it is asked for, once all `members` of the round have been
// asked: the groups then write their results at the same time.
class RemovesAllTransport final : public PoolTransport {
 public:
  RemovesAllTransport(std::string name, std::atomic<int>* arrived, int members)
      : name_(std::move(name)), arrived_(arrived), members_(members) {}
  const std::string& name() const override { return name_; }
  std::vector<BlockLookup> get(std::span<const PoolKey> k, std::span<const BlockSink>,
                               PoolDeadline) override {
    return std::vector<BlockLookup>(k.size(), BlockLookup::miss());
  }
  std::vector<Status> put(std::span<const PoolKey> k, std::span<const std::span<const std::byte>>,
                          PoolDeadline) override {
    return std::vector<Status>(k.size());
  }
  Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey> k,
                                                      PoolDeadline) override {
    return std::vector<std::optional<uint64_t>>(k.size());
  }
  Result<std::vector<bool>> remove(std::span<const PoolKey> k, PoolDeadline) override {
    // Bounded: a member left without keys would otherwise hold the others forever.
    arrived_->fetch_add(1);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (arrived_->load() % members_ != 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
    return std::vector<bool>(k.size(), true);
  }
  Result<PoolStats> stats(PoolDeadline) override { return PoolStats{}; }

 private:
  std::string name_;
  std::atomic<int>* arrived_;
  int members_;
};

std::vector<PoolKey> make_keys(int n, const std::string& tenant = "t") {
  std::vector<PoolKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back({tenant, 1000 + static_cast<uint64_t>(i) * 7919});
  return keys;
}

// Writes block i (seed i) under keys[i]; every put must succeed.
void put_all(PoolClient& client, const std::vector<PoolKey>& keys) {
  std::vector<std::vector<std::byte>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(make_block(i, kBlockBytes));
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  for (const Status& s : client.put(keys, views, kTimeout)) ASSERT_TRUE(s.ok()) << s.to_string();
}

// Reads every key; returns per key whether it was a hit with the right contents.
std::vector<bool> read_all(PoolClient& client, const std::vector<PoolKey>& keys) {
  std::vector<std::vector<std::byte>> buffers(keys.size(), std::vector<std::byte>(kBlockBytes));
  std::vector<BlockSink> sinks;
  for (auto& b : buffers) sinks.push_back(sink_into(b));
  std::vector<BlockLookup> results = client.get(keys, sinks, kTimeout);
  std::vector<bool> good(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_NE(results[i].kind, BlockLookup::Kind::kError) << results[i].error.to_string();
    good[i] = results[i].hit() && block_matches(buffers[i], i);
    if (results[i].hit()) {
      EXPECT_TRUE(block_matches(buffers[i], i)) << "wrong bytes for key " << i;
    }
  }
  return good;
}

TEST(PoolClientTest, BatchesSpreadOverMembersAndComeBack) {
  std::vector<std::shared_ptr<TieredBlockStore>> stores = {make_store(), make_store(),
                                                           make_store()};
  std::vector<std::unique_ptr<PoolTransport>> members;
  for (size_t m = 0; m < stores.size(); ++m) {
    members.push_back(std::make_unique<NamedLocalTransport>("m" + std::to_string(m), stores[m]));
  }
  auto client = PoolClient::create(std::move(members), {});
  const auto keys = make_keys(300);
  put_all(*client, keys);
  for (bool good : read_all(*client, keys)) EXPECT_TRUE(good);
  uint64_t total = 0;
  for (const auto& store : stores) {
    EXPECT_GT(store->stats().dram.blocks, 50u);  // each member holds a share
    total += store->stats().dram.blocks;
  }
  EXPECT_EQ(total, 300u);
  const PoolClientCounters c = client->counters();
  EXPECT_EQ(c.hits, 300u);
  EXPECT_EQ(c.bytes_loaded, 300 * kBlockBytes);
  EXPECT_EQ(c.bytes_stored, 300 * kBlockBytes);
  auto sizes = client->exists(keys, kTimeout);
  for (const auto& size : sizes) EXPECT_EQ(size, kBlockBytes);
  auto removed = client->remove(std::vector<PoolKey>(keys.begin(), keys.begin() + 10), kTimeout);
  for (bool r : removed) EXPECT_TRUE(r);
  EXPECT_FALSE(client->exists(keys, kTimeout)[0].has_value());
}

// The members' groups answer on their own threads: every key's result must survive the others'
// (a std::vector<bool> shared by the groups lost whole words of them).
TEST(PoolClientTest, RemoveKeepsTheResultsOfMembersAnsweringAtOnce) {
  constexpr int kMembers = 8;
  std::atomic<int> arrived{0};
  std::vector<std::unique_ptr<PoolTransport>> members;
  for (int m = 0; m < kMembers; ++m) {
    members.push_back(
        std::make_unique<RemovesAllTransport>("m" + std::to_string(m), &arrived, kMembers));
  }
  auto client = PoolClient::create(std::move(members), {});
  const auto keys = make_keys(200000);
  for (int round = 0; round < 20; ++round) {
    const std::vector<bool> removed = client->remove(keys, kTimeout);
    ASSERT_EQ(removed.size(), keys.size());
    EXPECT_EQ(std::count(removed.begin(), removed.end(), false), 0) << "round " << round;
  }
}

TEST(PoolClientTest, DownMemberIsAMissAndIsBackedOff) {
  auto store = make_store();
  auto down = std::make_unique<DownTransport>("dead:1");
  DownTransport* down_ptr = down.get();
  std::vector<std::unique_ptr<PoolTransport>> members;
  members.push_back(std::make_unique<NamedLocalTransport>("alive:1", store));
  members.push_back(std::move(down));
  PoolClientOptions options;
  options.down_backoff_initial = milliseconds(60000);  // stays down for the whole test
  auto client = PoolClient::create(std::move(members), options);
  const auto keys = make_keys(200);
  std::vector<std::vector<std::byte>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(make_block(i, kBlockBytes));
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  std::vector<Status> put_status = client->put(keys, views, kTimeout);
  size_t on_dead = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool owned_by_dead = client->owner_of(keys[i]) == "dead:1";
    on_dead += owned_by_dead;
    EXPECT_EQ(put_status[i].ok(), !owned_by_dead);
    if (owned_by_dead) {
      EXPECT_EQ(put_status[i].code(), StatusCode::kUnavailable);
    }
  }
  ASSERT_GT(on_dead, 0u);
  EXPECT_EQ(down_ptr->calls.load(), 1);
  const std::vector<bool> good = read_all(*client, keys);  // no errors: misses
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(good[i], client->owner_of(keys[i]) != "dead:1");
  }
  EXPECT_EQ(down_ptr->calls.load(), 1);  // backed off: not asked again
  const PoolClientCounters c = client->counters();
  EXPECT_EQ(c.unavailable_misses, on_dead);
  EXPECT_EQ(c.errors, 0u);
  EXPECT_EQ(client->exists(keys, kTimeout).size(), keys.size());
}

TEST(PoolClientTest, DownMemberIsRetriedAfterItsBackoff) {
  auto down = std::make_unique<DownTransport>("dead:1");
  DownTransport* down_ptr = down.get();
  std::vector<std::unique_ptr<PoolTransport>> members;
  members.push_back(std::move(down));
  PoolClientOptions options;
  options.down_backoff_initial = milliseconds(1);
  auto client = PoolClient::create(std::move(members), options);
  std::vector<std::byte> buffer(kBlockBytes);
  EXPECT_EQ(client->get_one({"t", 1}, buffer, kTimeout).kind, BlockLookup::Kind::kMiss);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(client->get_one({"t", 1}, buffer, kTimeout).kind, BlockLookup::Kind::kMiss);
  EXPECT_EQ(down_ptr->calls.load(), 2);
}

// A member going down and coming back is told once each (the engine logs it), not on every
// failed call while it stays down.
TEST(PoolClientTest, AMemberGoingDownAndComingBackIsToldOnceEach) {
  auto down = std::make_shared<std::atomic<bool>>(true);
  std::vector<std::unique_ptr<PoolTransport>> members;
  members.push_back(std::make_unique<NamedLocalTransport>("flaky:1", make_store(), down));
  std::vector<std::string> events;
  PoolClientOptions options;
  options.down_backoff_initial = milliseconds(1);
  options.on_member_state = [&](const std::string& member, const Status* why) {
    events.push_back(member + (why != nullptr ? " down: " + why->message() : " back"));
  };
  auto client = PoolClient::create(std::move(members), options);
  std::vector<std::byte> buffer(kBlockBytes);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(client->get_one({"t", 1}, buffer, kTimeout).kind, BlockLookup::Kind::kMiss);
    std::this_thread::sleep_for(milliseconds(5));  // past the backoff: asked again
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find(" down: off"), std::string::npos) << events[0];
  *down = false;
  std::this_thread::sleep_for(milliseconds(20));
  for (int i = 0; i < 2; ++i) client->get_one({"t", 1}, buffer, kTimeout);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[1].find(" back"), std::string::npos) << events[1];
}

TEST(PoolClientTest, AddingAMemberLosesOnlyItsShare) {
  std::vector<std::shared_ptr<TieredBlockStore>> stores;
  std::vector<std::unique_ptr<PoolTransport>> members;
  for (int m = 0; m < 3; ++m) {
    stores.push_back(make_store());
    members.push_back(std::make_unique<NamedLocalTransport>("m" + std::to_string(m), stores[m]));
  }
  auto client = PoolClient::create(std::move(members), {});
  const auto keys = make_keys(1200);
  put_all(*client, keys);
  client->add_member(std::make_unique<NamedLocalTransport>("m3", make_store()));
  const std::vector<bool> good = read_all(*client, keys);
  size_t lost = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool now_on_new = client->owner_of(keys[i]) == "m3";
    EXPECT_EQ(good[i], !now_on_new) << i;  // exactly the moved keys miss
    lost += now_on_new;
  }
  const double fraction = static_cast<double>(lost) / keys.size();
  EXPECT_GT(fraction, 0.25 * 0.6);
  EXPECT_LT(fraction, 0.25 * 1.4);
}

TEST(PoolClientTest, AsyncPutThenAsyncGet) {
  auto client = PoolClient::open_local(
      [] {
        TieredBlockStoreOptions o;
        o.dram_bytes = 8 << 20;
        return o;
      }(),
      {});
  ASSERT_TRUE(client.ok());
  const auto keys = make_keys(64);
  std::vector<std::vector<std::byte>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(make_block(i, kBlockBytes));
  auto put = (*client)->put_async(keys, std::move(blocks), kTimeout);
  for (const Status& s : put.get()) EXPECT_TRUE(s.ok());
  std::vector<std::vector<std::byte>> buffers(keys.size(), std::vector<std::byte>(kBlockBytes));
  std::vector<BlockSink> sinks;
  for (auto& b : buffers) sinks.push_back(sink_into(b));
  auto got = (*client)->get_async(keys, sinks, kTimeout).get();
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(got[i].hit());
    EXPECT_TRUE(block_matches(buffers[i], i));
  }
}

TEST(PoolClientTest, WrongSizedDestinationIsAnError) {
  auto client = PoolClient::open_local(
      [] {
        TieredBlockStoreOptions o;
        o.dram_bytes = 1 << 20;
        return o;
      }(),
      {});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->put_one({"t", 1}, make_block(1, 100), kTimeout).ok());
  std::vector<std::byte> small(50);
  BlockLookup r = (*client)->get_one({"t", 1}, small, kTimeout);
  EXPECT_EQ(r.kind, BlockLookup::Kind::kError);
  EXPECT_EQ(r.error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->get_one({"bad/tenant", 1}, small, kTimeout).kind, BlockLookup::Kind::kError);
}

TEST(PoolClientTest, MemberListErrorsNameTheEntry) {
  for (const char* bad : {"", "host", "host:", ":80", "a:1,a:1", "a:1,,b:2", "h:12x"}) {
    auto client = PoolClient::connect(bad, {});
    EXPECT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(PoolClient::connect("127.0.0.1:1,127.0.0.1:2", {}).ok());
}

}  // namespace
}  // namespace peerserve
