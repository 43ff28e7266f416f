// Fallible work items over a ThreadPool: the first error wins, the rest still run.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>

#include "base/status.h"
#include "base/thread_pool.h"

namespace peerserve {

// Runs fn(i) for every i in [0, n), spread over `pool`'s threads (nullptr or a one-thread
// pool: in order on the calling thread). Returns the first error reported (by time; every
// item runs regardless), or OK.
inline Status parallel_for_each(ThreadPool* pool, int64_t n,
                                const std::function<Status(int64_t)>& fn) {
  std::mutex mu;
  Status first = ok_status();
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      Status s = fn(i);
      if (!s.ok()) {
        const std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = std::move(s);
      }
    }
  };
  if (pool == nullptr || pool->num_threads() == 1) {
    run(0, n);
  } else {
    pool->parallel_for(n, run);
  }
  return first;
}

}  // namespace peerserve
