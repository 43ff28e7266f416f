// KvPoolConnector: the engine's side of the caching pool (paper 000 §4.4.1, context caching).
//
// At admission the engine asks the pool for the full prompt blocks that follow the ones
// cached locally (start_load). A worker thread reads them, in chain order, into staging
// buffers, keeps the leading run of hits (a prefix is only usable up to its first gap) and
// hands them back (take_loaded) — the request waits in a "loading" state meanwhile and the
// step loop never waits on the network. The engine then writes them into free KV blocks and
// publishes them in its prefix cache, so that admission shares them like local hits.
// Newly computed full prompt blocks go the other way (store): copied on the engine thread,
// written by the store's own background threads, best effort (a full write queue drops
// them; a block that is not in the pool is recomputed by whoever needs it).
//
// Keys are (tenant, hash) with the hash chain rooted in the engine's KvNamespace, so a block
// of another model, layout or tenant can never be returned.
//
// Thread-safety: start_load, take_loaded, store and counters from any thread (the engine
// thread in practice); `on_loaded` is called on the worker thread and must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/block_stream_client.h"
#include "cache/kv_block_store.h"
#include "kv/prefix_hash.h"
#include "runtime/kv_handoff_receiver.h"
#include "runtime/request.h"

namespace peerserve {

struct KvPoolConnectorOptions {
  std::string tenant = "default";           // the pool namespace (--kv-namespace)
  std::chrono::milliseconds timeout{2000};  // per pool call; past it, misses
  int64_t max_blocks_per_load = 8192;       // blocks asked for per request at most
  // Lookups (and remote prefills) in flight at once. Default 1.
  int workers = 1;
  // Prefill/decode disaggregation (the decode role): when blocks are missing from the pool,
  // have another instance compute the prompt (it stores the blocks in the pool), then read
  // them. Called on a worker thread; an error means "compute it here" (the request then
  // prefills locally). Default: none.
  // `push` (null without a hand-off receiver) asks the prefill instance to push the blocks
  // straight into this instance's reserved blocks instead.
  // `hint`: the request's preferred prefill instance (EngineRequest::prefill_hint), may be empty.
  // `cache_salt`: the request's (EngineRequest::cache_salt); the prefill instance must hash
  // the prompt's blocks under it too.
  std::function<Status(std::span<const TokenId> prompt, const KvPushTarget* push,
                       const std::string& hint, const std::string& cache_salt)>
      remote_prefill;
  // After a remote prefill, how long to wait for blocks that have not arrived yet (pushes and
  // pool writes are asynchronous). Default 1 s.
  std::chrono::milliseconds handoff_wait{1000};
  // Direct hand-off (the decode role): the receiver that the prefill instances push to, and
  // its block-stream endpoint as they reach it (host:port). Needs loads with destinations.
  std::shared_ptr<KvHandoffReceiver> handoff;
  std::string handoff_endpoint;
};

struct KvPoolCounters {
  int64_t loads = 0;             // requests looked up in the pool
  int64_t loads_cancelled = 0;   // aborted before their lookup started (not in `loads`)
  int64_t blocks_looked_up = 0;  // blocks asked for
  int64_t blocks_hit = 0;        // blocks loaded (the leading run of hits)
  int64_t bytes_loaded = 0;
  int64_t blocks_stored = 0;  // blocks handed to the pool for writing
  int64_t bytes_stored = 0;
  int64_t store_failures = 0;           // writes the pool refused or failed (known so far)
  double load_seconds_total = 0;        // time from start_load to loaded, summed
  int64_t remote_prefills = 0;          // prompts handed to a prefill instance
  int64_t remote_prefill_failures = 0;  // of which failed (then prefilled here)
  double remote_prefill_seconds_total = 0;
  int64_t pushes = 0;       // prefill role: hand-offs pushed to decode instances
  int64_t push_blocks = 0;  // blocks they accepted
  int64_t push_bytes = 0;
  int64_t push_failures = 0;      // blocks refused or not delivered
  double push_seconds_total = 0;  // time in the pushes' block-stream calls
  int64_t handoff_blocks = 0;     // decode role: blocks pushed straight into KV blocks
  int64_t handoff_bytes = 0;
  double handoff_seconds_total = 0;  // from the prefill call to the last block received
};

class KvPoolConnector {
 public:
  struct Loaded {
    RequestId request = 0;
    // The leading hits, in chain order: in `blocks` for a staged load, or written into the
    // load's destinations (`landed` of them) for a direct one.
    std::vector<std::vector<std::byte>> blocks;
    int64_t landed = 0;
    bool tail_landed = false;  // the prompt's partial block arrived in its destination
    double seconds = 0;        // how long the lookup took
  };

  // `store` must outlive the connector. `on_loaded` wakes the engine (a load finished).
  KvPoolConnector(std::shared_ptr<KvBlockStore> store, size_t block_bytes,
                  KvPoolConnectorOptions options, std::function<void()> on_loaded);
  ~KvPoolConnector();
  KvPoolConnector(const KvPoolConnector&) = delete;
  KvPoolConnector& operator=(const KvPoolConnector&) = delete;

  // Queues a lookup of `hashes` (consecutive chain blocks, starting at block `first_block`
  // of the prompt's chain) for `request`, whose prompt is `prompt` (used only for a remote
  // prefill). With `destinations` (one per hash, memory nobody else touches until the load
  // is taken back), blocks are written there (a direct load) instead of into buffers; a
  // prefill instance then also pushes the prompt's partial block into `tail_destination`
  // when there is one.
  void start_load(RequestId request, std::vector<BlockHash> hashes, std::vector<TokenId> prompt,
                  int64_t first_block = 0, std::vector<std::span<std::byte>> destinations = {},
                  std::span<std::byte> tail_destination = {}, std::string prefill_hint = {},
                  std::string cache_salt = {});
  // The request was aborted: if its load has not started, it is dropped (no lookup, no
  // remote prefill) and comes back from take_loaded() at once with nothing landed, so its
  // reserved blocks are freed now rather than after the jobs queued before it. A load that
  // is running finishes on its own (each of its calls is bounded by a timeout).
  void cancel(RequestId request);
  // Finished lookups (possibly with no blocks), in completion order.
  std::vector<Loaded> take_loaded();
  // Writes blocks[i] under hashes[i] in the background (best effort). Behind a pending push
  // it waits for the push to finish: a decode instance waits for the push, nobody waits for
  // the store, and on a shared core the two would slow each other down.
  void store(std::vector<BlockHash> hashes, std::vector<std::vector<std::byte>> blocks);
  // Prefill role: sends blocks[i] (hash hashes[i]) to a decode instance's hand-off receiver
  // in the background, in order (the receiver keeps the leading run that arrived). Pushes to
  // one decode instance go one at a time, in the order queued; pushes to different ones run
  // side by side, so one that does not answer holds up only its own (up to the timeout).
  void push(KvPushTarget target, std::vector<BlockHash> hashes,
            std::vector<std::vector<std::byte>> blocks);

  size_t block_bytes() const { return block_bytes_; }
  // Also collects the outcome of finished background writes.
  KvPoolCounters counters();

 private:
  struct Job {
    RequestId request = 0;
    std::vector<BlockHash> hashes;
    std::vector<TokenId> prompt;
    int64_t first_block = 0;
    std::vector<std::span<std::byte>> destinations;  // empty: staged
    std::span<std::byte> tail;                       // empty: none
    std::chrono::steady_clock::time_point queued;
    std::string prefill_hint;
    std::string cache_salt;
  };
  void run();
  // Reads hashes[from, end) from the pool into places[from, end); returns where the leading
  // run of hits (counted from 0) ends.
  size_t lookup(const std::vector<BlockHash>& hashes, size_t from,
                const std::vector<std::span<std::byte>>& places);
  // Has a prefill instance compute the job's prompt and fills places[hits, end) with what it
  // pushes (direct) or stores in the pool. Returns the new end of the leading run.
  size_t remote_prefill(const Job& job, size_t hits,
                        const std::vector<std::span<std::byte>>& places, bool* failed,
                        bool* tail_landed);
  void reap_stores(bool wait);

  std::shared_ptr<KvBlockStore> store_;
  const size_t block_bytes_;
  const KvPoolConnectorOptions options_;
  std::function<void()> on_loaded_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  std::vector<Loaded> loaded_;
  std::vector<std::future<std::vector<Status>>> pending_stores_;
  KvPoolCounters counters_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  struct Push {
    KvPushTarget target;
    std::vector<BlockHash> hashes;
    std::vector<std::vector<std::byte>> blocks;
    bool store_only = false;  // a pool store queued behind pushes (see store())
    uint64_t seq = 0;         // order of queueing
  };
  void run_pushes();
  // The next queued entry a pusher may take, or pushes_.end(): a push whose decode instance
  // has no push in flight, or a store none of whose earlier pushes is queued or in flight.
  // mutex_ held.
  std::deque<Push>::iterator next_push();
  // Hands blocks to the pool's background writes now.
  void start_store(std::vector<BlockHash> hashes, std::vector<std::vector<std::byte>> blocks);
  // Bounds of the queue, for pushes and for stores queued behind them, each on its own: a
  // stalled push used to let stores pile up without bound (a copy of every block) and then
  // fill the pushes' cap, so every later push was dropped.
  static constexpr size_t kMaxQueuedPushes = 64;
  static constexpr size_t kMaxQueuedPushesPerInstance = 8;
  static constexpr size_t kMaxQueuedStores = 64;
  std::deque<Push> pushes_;  // guarded by mutex_
  // The entries of pushes_ that are stores (store_only) or pushes; mutex_ held. At most 128.
  size_t queued(bool store_only) const;
  // Decode instances with a push in flight, and that push's place in the queue; mutex_ held.
  std::unordered_map<std::string, uint64_t> pushing_to_;
  uint64_t next_push_seq_ = 0;  // mutex_ held
  std::condition_variable push_wake_;
  // Clients per receiver endpoint; mutex_ held to look one up.
  std::unordered_map<std::string, std::shared_ptr<BlockStreamClient>> push_clients_;
  // A few pushes in flight at once, to different decode instances.
  static constexpr int kPushThreads = 4;
  std::vector<std::thread> pushers_;
};

}  // namespace peerserve
