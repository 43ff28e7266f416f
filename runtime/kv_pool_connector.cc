#include "runtime/kv_pool_connector.h"

#include <algorithm>
#include <utility>

#include "cache/socket_io.h"

namespace peerserve {

KvPoolConnector::KvPoolConnector(std::shared_ptr<KvBlockStore> store, size_t block_bytes,
                                 KvPoolConnectorOptions options, std::function<void()> on_loaded)
    : store_(std::move(store)),
      block_bytes_(block_bytes),
      options_(std::move(options)),
      on_loaded_(std::move(on_loaded)) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { run(); });
  }
  for (int i = 0; i < kPushThreads; ++i) pushers_.emplace_back([this] { run_pushes(); });
}

KvPoolConnector::~KvPoolConnector() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  push_wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  for (std::thread& pusher : pushers_) pusher.join();
  reap_stores(/*wait=*/true);  // each is bounded by the pool call's timeout
}

void KvPoolConnector::start_load(RequestId request, std::vector<BlockHash> hashes,
                                 std::vector<TokenId> prompt, int64_t first_block,
                                 std::vector<std::span<std::byte>> destinations,
                                 std::span<std::byte> tail_destination, std::string prefill_hint,
                                 std::string cache_salt) {
  if (static_cast<int64_t>(hashes.size()) > options_.max_blocks_per_load) {
    hashes.resize(static_cast<size_t>(options_.max_blocks_per_load));
  }
  if (!destinations.empty()) destinations.resize(hashes.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(Job{request, std::move(hashes), std::move(prompt), first_block,
                        std::move(destinations), tail_destination, std::chrono::steady_clock::now(),
                        std::move(prefill_hint), std::move(cache_salt)});
  }
  wake_.notify_one();
}

void KvPoolConnector::cancel(RequestId request) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto job = jobs_.begin(); job != jobs_.end(); ++job) {
    if (job->request != request) continue;
    jobs_.erase(job);
    Loaded dropped;
    dropped.request = request;
    loaded_.push_back(std::move(dropped));
    ++counters_.loads_cancelled;
    return;
  }
}

std::vector<KvPoolConnector::Loaded> KvPoolConnector::take_loaded() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Loaded> out;
  out.swap(loaded_);
  return out;
}

void KvPoolConnector::run() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Loaded loaded;
    loaded.request = job.request;
    const bool direct = !job.destinations.empty();
    int64_t remote = 0, remote_failed = 0;
    double remote_seconds = 0;
    size_t hits = 0;
    if (!job.hashes.empty()) {
      std::vector<std::vector<std::byte>> buffers;
      std::vector<std::span<std::byte>> places = job.destinations;
      if (!direct) {
        buffers.resize(job.hashes.size());
        for (auto& b : buffers) {
          b.resize(block_bytes_);
          places.emplace_back(b);
        }
      }
      hits = lookup(job.hashes, 0, places);
      if (hits < job.hashes.size() && options_.remote_prefill) {
        const auto started = std::chrono::steady_clock::now();
        remote = 1;
        bool failed = false;
        hits = remote_prefill(job, hits, places, &failed, &loaded.tail_landed);
        remote_failed = failed ? 1 : 0;
        remote_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
      if (direct) {
        loaded.landed = static_cast<int64_t>(hits);
      } else {
        buffers.resize(hits);
        loaded.blocks = std::move(buffers);
      }
    }
    loaded.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.queued).count();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.loads;
      counters_.blocks_looked_up += static_cast<int64_t>(job.hashes.size());
      counters_.blocks_hit += static_cast<int64_t>(hits);
      counters_.bytes_loaded += static_cast<int64_t>(hits * block_bytes_);
      counters_.load_seconds_total += loaded.seconds;
      counters_.remote_prefills += remote;
      counters_.remote_prefill_failures += remote_failed;
      counters_.remote_prefill_seconds_total += remote_seconds;
      loaded_.push_back(std::move(loaded));
    }
    if (on_loaded_) on_loaded_();
  }
}

size_t KvPoolConnector::lookup(const std::vector<BlockHash>& hashes, size_t from,
                               const std::vector<std::span<std::byte>>& places) {
  std::vector<PoolKey> keys;
  std::vector<BlockSink> sinks;
  for (size_t i = from; i < hashes.size(); ++i) {
    keys.push_back(PoolKey{options_.tenant, hashes[i]});
    sinks.push_back(sink_into(places[i]));
  }
  if (keys.empty()) return from;
  std::vector<BlockLookup> results = store_->get(keys, sinks, options_.timeout);
  size_t hits = from;
  while (hits - from < results.size() && results[hits - from].hit()) ++hits;
  return hits;
}

size_t KvPoolConnector::remote_prefill(const Job& job, size_t hits,
                                       const std::vector<std::span<std::byte>>& places,
                                       bool* failed, bool* tail_landed) {
  const auto started = std::chrono::steady_clock::now();
  if (options_.handoff && !job.destinations.empty()) {
    // Direct: the prefill instance pushes the missing blocks into the reserved KV blocks
    // (the partial block last, so it counts only when everything before it arrived).
    std::vector<BlockHash> expected(job.hashes.begin() + static_cast<std::ptrdiff_t>(hits),
                                    job.hashes.end());
    std::vector<std::span<std::byte>> into(places.begin() + static_cast<std::ptrdiff_t>(hits),
                                           places.end());
    const size_t num_full = expected.size();
    if (!job.tail.empty()) {
      expected.push_back(kPrefilledTailHash);
      into.push_back(job.tail);
    }
    const std::string name = options_.handoff->open(std::move(expected), std::move(into));
    const KvPushTarget target{options_.handoff_endpoint, name,
                              job.first_block + static_cast<int64_t>(hits), !job.tail.empty()};
    const bool ok =
        options_.remote_prefill(job.prompt, &target, job.prefill_hint, job.cache_salt).ok();
    // The push starts before the prefill instance answers; it may still be in flight.
    if (ok) {
      (void)options_.handoff->wait(name, std::chrono::steady_clock::now() + options_.handoff_wait);
    }
    // After close() nobody writes these blocks; the ones not received are recomputed here.
    size_t landed = options_.handoff->close(name);
    *tail_landed = !job.tail.empty() && landed == num_full + 1;
    landed = std::min(landed, num_full);
    *failed = !ok;
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.handoff_blocks += static_cast<int64_t>(landed);
    counters_.handoff_bytes += static_cast<int64_t>(landed * block_bytes_);
    counters_.handoff_seconds_total +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return hits + landed;
  }
  // Through the pool: the prefill instance stores the blocks there; read the missing ones
  // once they have landed (its writes are asynchronous).
  if (!options_.remote_prefill(job.prompt, nullptr, job.prefill_hint, job.cache_salt).ok()) {
    *failed = true;
    return hits;
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.handoff_wait;
  auto pause = std::chrono::milliseconds(2);
  while (true) {
    hits = lookup(job.hashes, hits, places);
    if (hits == job.hashes.size() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return hits;
}

size_t KvPoolConnector::queued(bool store_only) const {
  return static_cast<size_t>(std::count_if(
      pushes_.begin(), pushes_.end(), [&](const Push& p) { return p.store_only == store_only; }));
}

void KvPoolConnector::store(std::vector<BlockHash> hashes,
                            std::vector<std::vector<std::byte>> blocks) {
  if (hashes.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pushing_to_.empty() || !pushes_.empty()) {
      if (queued(/*store_only=*/true) >= kMaxQueuedStores) {
        // Best effort: a block not stored is computed again by whoever misses it.
        counters_.store_failures += static_cast<int64_t>(hashes.size());
        return;
      }
      pushes_.push_back(
          Push{{}, std::move(hashes), std::move(blocks), /*store_only=*/true, next_push_seq_++});
      push_wake_.notify_one();
      return;
    }
  }
  start_store(std::move(hashes), std::move(blocks));
}

void KvPoolConnector::start_store(std::vector<BlockHash> hashes,
                                  std::vector<std::vector<std::byte>> blocks) {
  std::vector<PoolKey> keys;
  keys.reserve(hashes.size());
  for (BlockHash h : hashes) keys.push_back(PoolKey{options_.tenant, h});
  const auto bytes = static_cast<int64_t>(blocks.size() * block_bytes_);
  auto done = store_->put_async(std::move(keys), std::move(blocks), options_.timeout);
  reap_stores(/*wait=*/false);
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.blocks_stored += static_cast<int64_t>(hashes.size());
  counters_.bytes_stored += bytes;
  pending_stores_.push_back(std::move(done));
}

void KvPoolConnector::push(KvPushTarget target, std::vector<BlockHash> hashes,
                           std::vector<std::vector<std::byte>> blocks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Bounded: behind a slow or dead decode instance the queue would hold every prompt's KV.
    // A push dropped here is recomputed by the decode instance after its wait.
    // Per decode instance too: one that stalls (each push waits out the timeout) used to fill
    // the whole queue, and the pushes to every other instance were dropped.
    const auto to_same = std::count_if(pushes_.begin(), pushes_.end(), [&](const Push& p) {
      return !p.store_only && p.target.endpoint == target.endpoint;
    });
    if (queued(/*store_only=*/false) >= kMaxQueuedPushes ||
        static_cast<size_t>(to_same) >= kMaxQueuedPushesPerInstance) {
      counters_.push_failures += static_cast<int64_t>(hashes.size());
      return;
    }
    pushes_.push_back(Push{std::move(target), std::move(hashes), std::move(blocks),
                           /*store_only=*/false, next_push_seq_++});
  }
  push_wake_.notify_one();
}

std::deque<KvPoolConnector::Push>::iterator KvPoolConnector::next_push() {
  // A store waits for the pushes queued before it (in the queue or in flight), not for
  // those queued after it: with several decode instances a push is nearly always in flight.
  uint64_t oldest_in_flight = UINT64_MAX;
  for (const auto& [endpoint, seq] : pushing_to_)
    oldest_in_flight = std::min(oldest_in_flight, seq);
  bool push_before = false;
  for (auto it = pushes_.begin(); it != pushes_.end(); ++it) {
    if (it->store_only) {
      if (!push_before && oldest_in_flight > it->seq) return it;
    } else {
      if (!pushing_to_.contains(it->target.endpoint)) return it;
      push_before = true;
    }
  }
  return pushes_.end();
}

void KvPoolConnector::run_pushes() {
  while (true) {
    Push push;
    std::shared_ptr<BlockStreamClient> client;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto next = pushes_.end();
      push_wake_.wait(lock, [&] {
        next = next_push();
        return next != pushes_.end() || (stopping_ && pushes_.empty());
      });
      if (next == pushes_.end()) return;  // stopping, and everything queued was sent
      push = std::move(*next);
      pushes_.erase(next);
      if (!push.store_only) {
        const std::string& endpoint = push.target.endpoint;
        pushing_to_.emplace(endpoint, push.seq);
        auto found = push_clients_.find(endpoint);
        if (found == push_clients_.end()) {
          // The endpoint was checked when the request was parsed; a bad one fails the sends.
          // Bounded: decode instances (a client in use stays alive through `client`).
          if (push_clients_.size() >= 64) push_clients_.clear();
          found = push_clients_
                      .emplace(endpoint, std::make_shared<BlockStreamClient>(
                                             endpoint_host(endpoint), endpoint_port(endpoint),
                                             "decode instance " + endpoint))
                      .first;
        }
        client = found->second;
      }
    }
    if (push.store_only) {
      start_store(std::move(push.hashes), std::move(push.blocks));
      continue;
    }
    std::vector<PoolKey> keys;
    std::vector<std::span<const std::byte>> spans;
    for (size_t i = 0; i < push.hashes.size(); ++i) {
      keys.push_back(PoolKey{push.target.transfer, push.hashes[i]});
      spans.emplace_back(push.blocks[i]);
    }
    const auto started = PoolClock::now();
    const std::vector<Status> sent = client->put(keys, spans, started + options_.timeout);
    const double seconds = std::chrono::duration<double>(PoolClock::now() - started).count();
    int64_t accepted = 0;
    bool unreachable = !sent.empty();  // every block failed in transport (down, timed out)
    for (const Status& s : sent) {
      accepted += s.ok() ? 1 : 0;
      unreachable = unreachable && s.code() == StatusCode::kUnavailable;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pushing_to_.erase(push.target.endpoint);
      ++counters_.pushes;
      counters_.push_blocks += accepted;
      counters_.push_bytes += accepted * static_cast<int64_t>(block_bytes_);
      counters_.push_failures += static_cast<int64_t>(push.hashes.size()) - accepted;
      counters_.push_seconds_total += seconds;
      if (unreachable) {
        // Nothing got through: the pushes queued behind it to the same instance would each
        // wait out the timeout too, while their decode instance stops waiting after its own.
        for (auto it = pushes_.begin(); it != pushes_.end();) {
          if (!it->store_only && it->target.endpoint == push.target.endpoint) {
            counters_.push_failures += static_cast<int64_t>(it->hashes.size());
            it = pushes_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    // Pushes to this decode instance, and stores behind the push, may go now.
    push_wake_.notify_all();
  }
}

void KvPoolConnector::reap_stores(bool wait) {
  std::vector<std::future<std::vector<Status>>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto ready = [&](std::future<std::vector<Status>>& f) {
      return wait || f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    };
    auto it = std::partition(pending_stores_.begin(), pending_stores_.end(),
                             [&](auto& f) { return !ready(f); });
    std::move(it, pending_stores_.end(), std::back_inserter(finished));
    pending_stores_.erase(it, pending_stores_.end());
  }
  int64_t failures = 0;
  for (auto& f : finished) {
    for (const Status& s : f.get()) failures += s.ok() ? 0 : 1;
  }
  if (failures > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.store_failures += failures;
  }
}

KvPoolCounters KvPoolConnector::counters() {
  reap_stores(/*wait=*/false);
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace peerserve
