// AsyncExecutor: a few worker threads running queued tasks in order, with a bounded queue so
// that a slow pool pushes back instead of growing memory without limit.
//
// Thread-safety: submit() from any thread. The destructor runs the tasks already queued,
// then joins the workers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace peerserve {

class AsyncExecutor {
 public:
  AsyncExecutor(int num_threads, size_t max_queued);
  ~AsyncExecutor();
  AsyncExecutor(const AsyncExecutor&) = delete;
  AsyncExecutor& operator=(const AsyncExecutor&) = delete;

  // Queues `task`; false (and `task` is not run) when max_queued tasks are already waiting.
  bool submit(std::function<void()> task);

 private:
  void worker_loop();

  size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace peerserve
