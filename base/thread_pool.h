// A fixed pool of worker threads for data-parallel loops in kernels.
//
// parallel_for splits [0, n) into one contiguous range per thread (static partition: GEMM
// and attention tiles are equal-cost, and on a 2-core machine scheduling overhead matters
// more than balance). The calling thread takes part, so ThreadPool(1) runs inline.
// Workers spin briefly before sleeping, because a decode step issues hundreds of short
// loops and a condition-variable wake costs tens of microseconds.
// Thread-safety: one parallel_for at a time per pool (the engine thread owns it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace peerserve {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n); returns when all are done.
  // Ranges are aligned to `grain` elements (except the last one).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                    int64_t grain = 1);

  // Calls fn(thread_idx, num_threads) once on every thread.
  void run_on_all(const std::function<void(int thread_idx, int num_threads)>& fn);

 private:
  void worker_loop(int thread_idx);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace peerserve
