#include "base/thread_pool.h"

#include <algorithm>

namespace peerserve {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_parts(uint32_t generation) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(claim >> 32) != generation) return;  // a later job: not ours
    const int part = static_cast<int>(claim & 0xffffffffu);
    if (part >= num_threads_) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    // The job cannot finish (and job_ cannot change) while this claimed part is pending.
    job_(part, num_threads_);
    parts_done_.fetch_add(1, std::memory_order_acq_rel);
    claim = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    // Spin a little: the next job usually arrives within microseconds during a step.
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < 20000; ++spin) {
      __builtin_ia32_pause();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      gen = generation_.load();
    }
    seen = gen;
    if (stop_.load()) return;
    run_parts(gen);
  }
}

void ThreadPool::run_on_all(FunctionRef<void(int, int)> fn) {
  if (num_threads_ == 1) {
    fn(0, 1);
    return;
  }
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  job_ = fn;
  parts_done_.store(0, std::memory_order_relaxed);
  claim_.store(uint64_t{gen} << 32, std::memory_order_release);
  {
    std::lock_guard lock(mutex_);
    generation_.store(gen, std::memory_order_release);
  }
  wake_.notify_all();
  run_parts(gen);
  while (parts_done_.load(std::memory_order_acquire) != num_threads_) __builtin_ia32_pause();
  job_ = {};
}

void ThreadPool::parallel_for(int64_t n, FunctionRef<void(int64_t, int64_t)> fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  if (num_threads_ == 1 || chunks == 1) {
    fn(0, n);
    return;
  }
  run_on_all([&](int t, int nt) {
    const int64_t c0 = chunks * t / nt, c1 = chunks * (t + 1) / nt;
    const int64_t begin = c0 * grain, end = std::min(n, c1 * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace peerserve
