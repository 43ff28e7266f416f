#include "cache/pool_client.h"

#include <algorithm>
#include <cstdint>
#include <future>
#include <mutex>
#include <set>

#include "base/host_port.h"
#include "cache/grpc_pool_transport.h"
#include "cache/local_pool_transport.h"

namespace peerserve {

struct PoolClient::Member {
  std::unique_ptr<PoolTransport> transport;
  std::mutex mutex;  // guards the two fields below
  PoolClock::time_point down_until{};
  std::chrono::milliseconds backoff{0};
};

struct PoolClient::Placement {
  std::vector<std::shared_ptr<Member>> members;  // one per group
  std::vector<std::vector<size_t>> indices;      // key indices per group
};

Result<std::unique_ptr<PoolClient>> PoolClient::connect(std::string_view members,
                                                        const PoolClientOptions& options) {
  std::vector<std::unique_ptr<PoolTransport>> transports;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= members.size()) {
    size_t end = members.find(',', start);
    if (end == std::string_view::npos) end = members.size();
    const std::string address(members.substr(start, end - start));
    if (Status valid = check_host_port(address, "cache pool member"); !valid.ok()) {
      return address == members
                 ? valid
                 : invalid_argument(valid.message() + " in '" + std::string(members) + "'");
    }
    if (!seen.insert(address).second) {
      return invalid_argument("cache pool member '" + address + "' listed twice");
    }
    transports.push_back(make_grpc_pool_transport(
        address, GrpcPoolTransportOptions{.connect_timeout = options.connect_timeout,
                                          .use_block_stream = options.use_block_stream}));
    start = end + 1;
  }
  return create(std::move(transports), options);
}

Result<std::unique_ptr<PoolClient>> PoolClient::open_local(
    const TieredBlockStoreOptions& store_options, const PoolClientOptions& options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<TieredBlockStore> store,
                      TieredBlockStore::open(store_options));
  std::vector<std::unique_ptr<PoolTransport>> members;
  members.push_back(
      std::make_unique<LocalPoolTransport>(std::shared_ptr<TieredBlockStore>(std::move(store))));
  return create(std::move(members), options);
}

std::unique_ptr<PoolClient> PoolClient::create(std::vector<std::unique_ptr<PoolTransport>> members,
                                               const PoolClientOptions& options) {
  auto client = std::make_unique<PoolClient>(ConstructionKey{}, options);
  for (auto& member : members) client->add_member(std::move(member));
  return client;
}

PoolClient::PoolClient(ConstructionKey, const PoolClientOptions& options)
    : options_(options),
      ring_(options.virtual_nodes),
      executor_(std::make_unique<AsyncExecutor>(options.async_threads, options.max_queued_async)) {}

PoolClient::~PoolClient() {
  executor_.reset();  // finishes queued async calls while the members still exist
}

void PoolClient::add_member(std::unique_ptr<PoolTransport> transport) {
  auto member = std::make_shared<Member>();
  member->transport = std::move(transport);
  std::unique_lock lock(ring_mutex_);
  const size_t index = ring_.add(member->transport->name());
  PS_CHECK_EQ(index, members_.size());
  members_.push_back(std::move(member));
}

size_t PoolClient::num_members() const {
  std::shared_lock lock(ring_mutex_);
  return members_.size();
}

std::string PoolClient::owner_of(const PoolKey& key) const {
  std::shared_lock lock(ring_mutex_);
  return ring_.member(ring_.owner(key));
}

PoolClient::Placement PoolClient::place(std::span<const PoolKey> keys) const {
  Placement placement;
  std::shared_lock lock(ring_mutex_);
  PS_CHECK(!members_.empty()) << "cache pool client has no members";
  std::vector<int> group_of_member(members_.size(), -1);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t m = ring_.owner(keys[i]);
    if (group_of_member[m] < 0) {
      group_of_member[m] = static_cast<int>(placement.members.size());
      placement.members.push_back(members_[m]);
      placement.indices.emplace_back();
    }
    placement.indices[group_of_member[m]].push_back(i);
  }
  return placement;
}

void PoolClient::for_each_group(
    const Placement& placement,
    const std::function<void(Member&, const std::vector<size_t>&)>& fn) {
  std::vector<std::future<void>> others;
  for (size_t g = 1; g < placement.members.size(); ++g) {
    others.push_back(std::async(std::launch::async,
                                [&, g] { fn(*placement.members[g], placement.indices[g]); }));
  }
  if (!placement.members.empty()) fn(*placement.members[0], placement.indices[0]);
  for (auto& f : others) f.get();
}

bool PoolClient::is_down(Member& member) const {
  std::lock_guard lock(member.mutex);
  return PoolClock::now() < member.down_until;
}

void PoolClient::record_outcome(Member& member, const Status& outcome) {
  const bool unavailable = outcome.code() == StatusCode::kUnavailable;
  bool went_down = false, came_back = false;
  {
    std::lock_guard lock(member.mutex);
    if (!unavailable) {
      came_back = member.backoff.count() != 0;
      member.backoff = std::chrono::milliseconds(0);
      member.down_until = {};
    } else {
      went_down = member.backoff.count() == 0;
      member.backoff = member.backoff.count() == 0
                           ? options_.down_backoff_initial
                           : std::min(member.backoff * 2, options_.down_backoff_max);
      member.down_until = PoolClock::now() + member.backoff;
    }
  }
  // Outside the lock: the callback may log.
  if (options_.on_member_state && (went_down || came_back)) {
    options_.on_member_state(member.transport->name(), went_down ? &outcome : nullptr);
  }
}

std::vector<BlockLookup> PoolClient::get(std::span<const PoolKey> keys,
                                         std::span<const BlockSink> sinks,
                                         std::chrono::milliseconds timeout) {
  PS_CHECK_EQ(keys.size(), sinks.size());
  const PoolDeadline deadline = PoolClock::now() + timeout;
  std::vector<BlockLookup> out(keys.size());
  std::vector<uint64_t> sizes(keys.size(), 0);
  const Placement placement = place(keys);
  for_each_group(placement, [&](Member& member, const std::vector<size_t>& indices) {
    if (is_down(member)) {
      for (size_t i : indices) out[i] = BlockLookup::failed(unavailable("member down"));
      return;
    }
    std::vector<PoolKey> sub_keys;
    std::vector<BlockSink> sub_sinks;
    for (size_t i : indices) {
      sub_keys.push_back(keys[i]);
      sub_sinks.push_back([&sinks, &sizes, i](size_t size) {
        sizes[i] = size;
        return sinks[i](size);
      });
    }
    std::vector<BlockLookup> results = member.transport->get(sub_keys, sub_sinks, deadline);
    Status outcome = ok_status();
    for (size_t j = 0; j < indices.size(); ++j) {
      if (outcome.ok() && results[j].kind == BlockLookup::Kind::kError &&
          results[j].error.code() == StatusCode::kUnavailable) {
        outcome = results[j].error;
      }
      out[indices[j]] = std::move(results[j]);
    }
    record_outcome(member, outcome);
  });
  for (size_t i = 0; i < out.size(); ++i) {
    ++lookups_;
    if (out[i].hit()) {
      ++hits_;
      bytes_loaded_ += sizes[i];
    } else if (out[i].kind == BlockLookup::Kind::kError &&
               out[i].error.code() == StatusCode::kUnavailable) {
      out[i] = BlockLookup::miss();  // a member that is down is a miss, not an error
      ++misses_;
      ++unavailable_misses_;
    } else if (out[i].kind == BlockLookup::Kind::kMiss) {
      ++misses_;
    } else {
      ++errors_;
    }
  }
  return out;
}

std::vector<Status> PoolClient::put(std::span<const PoolKey> keys,
                                    std::span<const std::span<const std::byte>> blocks,
                                    std::chrono::milliseconds timeout) {
  PS_CHECK_EQ(keys.size(), blocks.size());
  const PoolDeadline deadline = PoolClock::now() + timeout;
  std::vector<Status> out(keys.size());
  const Placement placement = place(keys);
  for_each_group(placement, [&](Member& member, const std::vector<size_t>& indices) {
    if (is_down(member)) {
      for (size_t i : indices) {
        out[i] = unavailable("cache server " + member.transport->name() + " is marked down");
      }
      return;
    }
    std::vector<PoolKey> sub_keys;
    std::vector<std::span<const std::byte>> sub_blocks;
    for (size_t i : indices) {
      sub_keys.push_back(keys[i]);
      sub_blocks.push_back(blocks[i]);
    }
    std::vector<Status> results = member.transport->put(sub_keys, sub_blocks, deadline);
    Status outcome = ok_status();
    for (size_t j = 0; j < indices.size(); ++j) {
      if (outcome.ok() && results[j].code() == StatusCode::kUnavailable) outcome = results[j];
      out[indices[j]] = std::move(results[j]);
    }
    record_outcome(member, outcome);
  });
  for (size_t i = 0; i < out.size(); ++i) {
    ++puts_;
    if (out[i].ok()) {
      bytes_stored_ += blocks[i].size();
    } else {
      ++put_failures_;
    }
  }
  return out;
}

std::vector<std::optional<uint64_t>> PoolClient::exists(std::span<const PoolKey> keys,
                                                        std::chrono::milliseconds timeout) {
  const PoolDeadline deadline = PoolClock::now() + timeout;
  std::vector<std::optional<uint64_t>> out(keys.size());
  const Placement placement = place(keys);
  for_each_group(placement, [&](Member& member, const std::vector<size_t>& indices) {
    if (is_down(member)) return;
    std::vector<PoolKey> sub_keys;
    for (size_t i : indices) sub_keys.push_back(keys[i]);
    auto result = member.transport->exists(sub_keys, deadline);
    record_outcome(member, result.ok() ? ok_status() : result.status());
    if (!result.ok()) return;
    for (size_t j = 0; j < indices.size(); ++j) out[indices[j]] = (*result)[j];
  });
  return out;
}

std::vector<bool> PoolClient::remove(std::span<const PoolKey> keys,
                                     std::chrono::milliseconds timeout) {
  const PoolDeadline deadline = PoolClock::now() + timeout;
  // One byte per key: the groups write their keys' results from their own threads, and
  // std::vector<bool> packs neighbouring keys (of other members) into one word, whose
  // read-modify-write by two groups at once lost one group's results.
  std::vector<uint8_t> removed(keys.size(), 0);
  const Placement placement = place(keys);
  for_each_group(placement, [&](Member& member, const std::vector<size_t>& indices) {
    if (is_down(member)) return;
    std::vector<PoolKey> sub_keys;
    for (size_t i : indices) sub_keys.push_back(keys[i]);
    auto result = member.transport->remove(sub_keys, deadline);
    record_outcome(member, result.ok() ? ok_status() : result.status());
    if (!result.ok()) return;
    for (size_t j = 0; j < indices.size(); ++j) removed[indices[j]] = (*result)[j] ? 1 : 0;
  });
  return std::vector<bool>(removed.begin(), removed.end());
}

std::future<std::vector<BlockLookup>> PoolClient::get_async(std::vector<PoolKey> keys,
                                                            std::vector<BlockSink> sinks,
                                                            std::chrono::milliseconds timeout) {
  auto task = std::make_shared<std::packaged_task<std::vector<BlockLookup>()>>(
      [this, keys = std::move(keys), sinks = std::move(sinks), timeout] {
        return get(keys, sinks, timeout);
      });
  std::future<std::vector<BlockLookup>> future = task->get_future();
  if (!executor_->submit([task] { (*task)(); })) {
    ++async_rejected_;
    (*task)();  // a read the caller waits for anyway: run it here rather than fail it
  }
  return future;
}

std::future<std::vector<Status>> PoolClient::put_async(std::vector<PoolKey> keys,
                                                       std::vector<std::vector<std::byte>> blocks,
                                                       std::chrono::milliseconds timeout) {
  PS_CHECK_EQ(keys.size(), blocks.size());
  const size_t count = keys.size();
  auto task = std::make_shared<std::packaged_task<std::vector<Status>()>>(
      [this, keys = std::move(keys), blocks = std::move(blocks), timeout] {
        std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
        return put(keys, views, timeout);
      });
  std::future<std::vector<Status>> future = task->get_future();
  if (!executor_->submit([task] { (*task)(); })) {
    ++async_rejected_;
    puts_ += count;
    put_failures_ += count;
    std::promise<std::vector<Status>> refused;
    refused.set_value(std::vector<Status>(
        count, resource_exhausted("cache pool client: too many writes queued")));
    return refused.get_future();
  }
  return future;
}

BlockLookup PoolClient::get_one(const PoolKey& key, std::span<std::byte> dst,
                                std::chrono::milliseconds timeout) {
  const BlockSink sink = sink_into(dst);
  return std::move(
      get(std::span<const PoolKey>(&key, 1), std::span<const BlockSink>(&sink, 1), timeout)[0]);
}

Status PoolClient::put_one(const PoolKey& key, std::span<const std::byte> block,
                           std::chrono::milliseconds timeout) {
  return std::move(put(std::span<const PoolKey>(&key, 1),
                       std::span<const std::span<const std::byte>>(&block, 1), timeout)[0]);
}

std::vector<MemberStats> PoolClient::member_stats(std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<Member>> members;
  {
    std::shared_lock lock(ring_mutex_);
    members = members_;
  }
  const PoolDeadline deadline = PoolClock::now() + timeout;
  std::vector<MemberStats> out;
  for (const auto& member : members) {
    MemberStats s;
    s.member = member->transport->name();
    s.marked_down = is_down(*member);
    s.stats = member->transport->stats(deadline);
    out.push_back(std::move(s));
  }
  return out;
}

PoolClientCounters PoolClient::counters() const {
  PoolClientCounters c;
  c.lookups = lookups_.load();
  c.hits = hits_.load();
  c.misses = misses_.load();
  c.unavailable_misses = unavailable_misses_.load();
  c.errors = errors_.load();
  c.bytes_loaded = bytes_loaded_.load();
  c.puts = puts_.load();
  c.put_failures = put_failures_.load();
  c.bytes_stored = bytes_stored_.load();
  c.async_rejected = async_rejected_.load();
  return c;
}

}  // namespace peerserve
