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
  worker_ = std::thread([this] { run(); });
}

KvPoolConnector::~KvPoolConnector() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
  reap_stores(/*wait=*/true);  // each is bounded by the pool call's timeout
}

void KvPoolConnector::start_load(RequestId request, std::vector<BlockHash> hashes) {
  if (static_cast<int64_t>(hashes.size()) > options_.max_blocks_per_load) {
    hashes.resize(static_cast<size_t>(options_.max_blocks_per_load));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(Job{request, std::move(hashes), std::chrono::steady_clock::now()});
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
    if (!job.hashes.empty()) {
      std::vector<PoolKey> keys;
      std::vector<BlockSink> sinks;
      std::vector<std::vector<std::byte>> buffers(job.hashes.size(),
                                                  std::vector<std::byte>(block_bytes_));
      for (size_t i = 0; i < job.hashes.size(); ++i) {
        keys.push_back(PoolKey{options_.tenant, job.hashes[i]});
        sinks.push_back(sink_into(buffers[i]));
      }
      std::vector<BlockLookup> results = store_->get(keys, sinks, options_.timeout);
      size_t hits = 0;
      while (hits < results.size() && hits < buffers.size() && results[hits].hit()) ++hits;
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
      loaded_.push_back(std::move(loaded));
    }
    if (on_loaded_) on_loaded_();
  }
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
