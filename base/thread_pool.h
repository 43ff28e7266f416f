// A fixed pool of worker threads for data-parallel loops in kernels.
//
// A loop is cut into one part per thread with fixed boundaries (static partition: GEMM and
// attention tiles are equal-cost, and results must not depend on timing). Parts are
// claimed, not assigned: the calling thread runs its part and then any part no worker has
// claimed yet, so a worker that the OS has descheduled (a shared 2-core machine) delays
// nobody. Which thread runs a part never changes what the part computes.
// Workers spin briefly before sleeping, because a decode step issues hundreds of short
// loops and a condition-variable wake costs tens of microseconds.
// A part that throws does not end the loop early: every part still runs (or is skipped by
// its own throw), the loop returns once all are done, and then rethrows the first exception
// on the calling thread (a throw that left early freed the job's captures while workers
// still ran it; one on a worker ended the process).
// Thread-safety: one loop at a time per pool (the engine thread owns it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/function_ref.h"

namespace peerserve {

class ThreadPool {
 public:
  // num_threads <= 0 means available_cpus(). Throws std::system_error naming the thread
  // when one cannot be started (after stopping the ones that were).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n); returns when all are done.
  // Ranges are aligned to `grain` elements (except the last one).
  void parallel_for(int64_t n, FunctionRef<void(int64_t begin, int64_t end)> fn, int64_t grain = 1);

  // Calls fn(part_idx, num_parts) once for every part_idx in [0, num_threads()), spread
  // over the pool's threads; returns when all parts are done.
  void run_on_all(FunctionRef<void(int part_idx, int num_parts)> fn);

 private:
  void worker_loop();
  void stop_workers();
  // Claims and runs parts of the job of `generation` until none is left.
  void run_parts(uint32_t generation);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  FunctionRef<void(int, int)> job_;  // the loop running now
  // High 32 bits: the job's generation; low 32 bits: the next unclaimed part.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> parts_done_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex failure_mutex_;
  std::exception_ptr failure_;  // the first exception a part of the running loop threw
};

// The CPUs the calling thread may run on (its affinity mask, which threads inherit from
// the process: taskset, cpusets), at least 1.
// std::thread::hardware_concurrency() counts every online CPU: pinned to one of a 64-CPU
// host, a default pool started 64 threads that spun on that one.
int available_cpus();

}  // namespace peerserve
