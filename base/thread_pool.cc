#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <string>
#include <system_error>
#include <utility>

namespace peerserve {

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = available_cpus();
  num_threads_ = std::max(1, num_threads);
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int t = 1; t < num_threads_; ++t) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {
      // The started workers wait on wake_: left alone, destroying it blocked for ever.
      stop_workers();
      throw std::system_error(e.code(), "cannot start thread " + std::to_string(t + 1) + " of " +
                                            std::to_string(num_threads_));
    } catch (...) {  // std::bad_alloc from std::thread's own state
      stop_workers();
      throw;
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::stop_workers() {
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
    try {
      job_(part, num_threads_);
    } catch (...) {
      std::lock_guard lock(failure_mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
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
    fn(0, 1);  // a throw leaves nothing running
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
  std::exception_ptr failure;
  {
    std::lock_guard lock(failure_mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

void ThreadPool::parallel_for(int64_t n, FunctionRef<void(int64_t, int64_t)> fn, int64_t grain) {
  if (n <= 0) return;
  // n + grain - 1 and c1 * grain stay below 2n: in range for any n up to INT64_MAX / 2.
  grain = std::clamp<int64_t>(grain, 1, n);
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
