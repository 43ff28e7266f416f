// PoolClient: the caching pool's client SDK (the paper's MP SDK). It places every key on one
// member by consistent hashing (HashRing), splits batches per member and calls the members
// in parallel, and turns member failures into misses.
//
// Faults: a member whose call fails with kUnavailable (down, refusing, past the deadline) is
// marked down and skipped (its keys read as misses, its writes fail with kUnavailable)
// for a backoff that starts at down_backoff_initial and doubles up to down_backoff_max;
// the first call after the backoff tries it again, and a success clears it. So a dead
// member costs one timeout, not one per call.
//
// Thread-safety: every method may be called from any thread; add_member() too.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cache/async_executor.h"
#include "cache/hash_ring.h"
#include "cache/kv_block_store.h"
#include "cache/pool_transport.h"
#include "cache/tiered_block_store.h"

namespace peerserve {

struct PoolClientOptions {
  std::chrono::milliseconds connect_timeout{300};  // per member, gRPC members only
  // Blocks over the members' block-stream ports where they offer one (else over gRPC).
  bool use_block_stream = true;
  std::chrono::milliseconds down_backoff_initial{250};
  std::chrono::milliseconds down_backoff_max{8000};
  int virtual_nodes = 160;
  int async_threads = 2;
  size_t max_queued_async = 256;  // async calls waiting; beyond it put_async fails fast
  // Called when a member stops answering (`down`: why) and when it answers again (null);
  // not for every failed call. On the calling thread, outside the client's locks.
  std::function<void(const std::string& member, const Status* down)> on_member_state;
};

// Counters of one client, for metrics.
struct PoolClientCounters {
  uint64_t lookups = 0;  // blocks asked for
  uint64_t hits = 0;
  uint64_t misses = 0;              // including the two below
  uint64_t unavailable_misses = 0;  // misses because a member was down or too slow
  uint64_t errors = 0;              // lookups that failed for another reason
  uint64_t bytes_loaded = 0;
  uint64_t puts = 0;  // blocks offered
  uint64_t put_failures = 0;
  uint64_t bytes_stored = 0;
  uint64_t async_rejected = 0;  // async calls refused because the queue was full
};

struct MemberStats {
  std::string member;
  Result<PoolStats> stats = unavailable("not asked");
  bool marked_down = false;
};

class PoolClient final : public KvBlockStore {
  struct ConstructionKey {};

 public:
  // A client over gRPC members listed as "host:port,host:port,...". Errors: an empty list,
  // an entry without a port, or a duplicate (names it). Connects lazily.
  static Result<std::unique_ptr<PoolClient>> connect(std::string_view members,
                                                     const PoolClientOptions& options);
  // The embedded pool: one in-process member over a store opened from `store_options`.
  static Result<std::unique_ptr<PoolClient>> open_local(
      const TieredBlockStoreOptions& store_options, const PoolClientOptions& options);
  // A client over given transports (tests, other transports). REQUIRES: distinct names.
  static std::unique_ptr<PoolClient> create(std::vector<std::unique_ptr<PoolTransport>> members,
                                            const PoolClientOptions& options);
  PoolClient(ConstructionKey, const PoolClientOptions& options);
  ~PoolClient() override;

  std::vector<BlockLookup> get(std::span<const PoolKey> keys, std::span<const BlockSink> sinks,
                               std::chrono::milliseconds timeout) override;
  std::vector<Status> put(std::span<const PoolKey> keys,
                          std::span<const std::span<const std::byte>> blocks,
                          std::chrono::milliseconds timeout) override;
  std::vector<std::optional<uint64_t>> exists(std::span<const PoolKey> keys,
                                              std::chrono::milliseconds timeout) override;
  std::vector<bool> remove(std::span<const PoolKey> keys,
                           std::chrono::milliseconds timeout) override;
  std::future<std::vector<BlockLookup>> get_async(std::vector<PoolKey> keys,
                                                  std::vector<BlockSink> sinks,
                                                  std::chrono::milliseconds timeout) override;
  std::future<std::vector<Status>> put_async(std::vector<PoolKey> keys,
                                             std::vector<std::vector<std::byte>> blocks,
                                             std::chrono::milliseconds timeout) override;

  // Single-block conveniences.
  BlockLookup get_one(const PoolKey& key, std::span<std::byte> dst,
                      std::chrono::milliseconds timeout);
  Status put_one(const PoolKey& key, std::span<const std::byte> block,
                 std::chrono::milliseconds timeout);

  // Adds a member: from now on it owns its share of the ring (about 1/(n+1) of all keys,
  // which it does not hold yet: those read as misses until written again).
  void add_member(std::unique_ptr<PoolTransport> member);
  size_t num_members() const;
  // The member name that owns `key`.
  std::string owner_of(const PoolKey& key) const;

  std::vector<MemberStats> member_stats(std::chrono::milliseconds timeout);
  PoolClientCounters counters() const;

 private:
  struct Member;
  struct Placement;

  // Groups key indices by owning member (snapshot of the ring under the lock).
  Placement place(std::span<const PoolKey> keys) const;
  // Runs fn(member, indices) for every group, in parallel when there are several.
  void for_each_group(const Placement& placement,
                      const std::function<void(Member&, const std::vector<size_t>&)>& fn);
  bool is_down(Member& member) const;
  // `outcome`: OK, or the call's first error (Unavailable marks the member down a while).
  void record_outcome(Member& member, const Status& outcome);

  PoolClientOptions options_;
  mutable std::shared_mutex ring_mutex_;
  HashRing ring_;
  std::vector<std::shared_ptr<Member>> members_;  // by ring index
  std::unique_ptr<AsyncExecutor> executor_;

  std::atomic<uint64_t> lookups_{0}, hits_{0}, misses_{0}, unavailable_misses_{0}, errors_{0},
      bytes_loaded_{0}, puts_{0}, put_failures_{0}, bytes_stored_{0}, async_rejected_{0};
};

}  // namespace peerserve
