// Fallible work items over a ThreadPool: the first error wins, the rest still run.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "base/status.h"
#include "base/thread_pool.h"

namespace peerserve {

// Runs fn(i) for every i in [0, n), spread over `pool`'s threads (nullptr or a one-thread
// pool: in order on the calling thread). Returns the first error reported (by time; every
// item runs regardless), or OK. An item that throws reports an error too: ResourceExhausted
// for std::bad_alloc (memory running out while weights are packed at load), Internal with
// the exception's text otherwise.
inline Status parallel_for_each(ThreadPool* pool, int64_t n,
                                const std::function<Status(int64_t)>& fn) {
  std::mutex mu;
  Status first = ok_status();
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      Status s = ok_status();
      try {
        s = fn(i);
      } catch (const std::bad_alloc&) {
        s = resource_exhausted("item " + std::to_string(i) + ": out of memory");
      } catch (const std::exception& e) {
        s = internal_error("item " + std::to_string(i) + ": " + e.what());
      }
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
