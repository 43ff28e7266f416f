#include "runtime/kv_pool_connector.h"

#include <algorithm>
#include <utility>

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
}

KvPoolConnector::~KvPoolConnector() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  reap_stores(/*wait=*/true);  // each is bounded by the pool call's timeout
}

void KvPoolConnector::start_load(RequestId request, std::vector<BlockHash> hashes,
                                 std::vector<TokenId> prompt) {
  if (static_cast<int64_t>(hashes.size()) > options_.max_blocks_per_load) {
    hashes.resize(static_cast<size_t>(options_.max_blocks_per_load));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(
        Job{request, std::move(hashes), std::move(prompt), std::chrono::steady_clock::now()});
  }
  wake_.notify_one();
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
    int64_t remote = 0, remote_failed = 0;
    double remote_seconds = 0;
    if (!job.hashes.empty()) {
      std::vector<std::vector<std::byte>> buffers(job.hashes.size());
      size_t hits = lookup(job.hashes, 0, &buffers);
      if (hits < job.hashes.size() && options_.remote_prefill) {
        // Disaggregated: another instance computes the prompt and stores its blocks in the
        // pool; read the missing ones once they have landed (writes are asynchronous there).
        const auto started = std::chrono::steady_clock::now();
        remote = 1;
        if (options_.remote_prefill(job.prompt).ok()) {
          const auto deadline = std::chrono::steady_clock::now() + options_.handoff_wait;
          auto pause = std::chrono::milliseconds(2);
          while (true) {
            hits = lookup(job.hashes, hits, &buffers);
            if (hits == job.hashes.size() || std::chrono::steady_clock::now() >= deadline) break;
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::milliseconds(50));
          }
        } else {
          remote_failed = 1;
        }
        remote_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
      buffers.resize(hits);
      loaded.blocks = std::move(buffers);
    }
    loaded.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.queued).count();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.loads;
      counters_.blocks_looked_up += static_cast<int64_t>(job.hashes.size());
      counters_.blocks_hit += static_cast<int64_t>(loaded.blocks.size());
      counters_.bytes_loaded += static_cast<int64_t>(loaded.blocks.size() * block_bytes_);
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
                               std::vector<std::vector<std::byte>>* buffers) {
  std::vector<PoolKey> keys;
  std::vector<BlockSink> sinks;
  for (size_t i = from; i < hashes.size(); ++i) {
    (*buffers)[i].resize(block_bytes_);
    keys.push_back(PoolKey{options_.tenant, hashes[i]});
    sinks.push_back(sink_into((*buffers)[i]));
  }
  if (keys.empty()) return from;
  std::vector<BlockLookup> results = store_->get(keys, sinks, options_.timeout);
  size_t hits = from;
  while (hits - from < results.size() && results[hits - from].hit()) ++hits;
  return hits;
}

void KvPoolConnector::store(std::vector<BlockHash> hashes,
                            std::vector<std::vector<std::byte>> blocks) {
  if (hashes.empty()) return;
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
