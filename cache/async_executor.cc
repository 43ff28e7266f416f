#include "cache/async_executor.h"

#include "base/check.h"

namespace peerserve {

AsyncExecutor::AsyncExecutor(int num_threads, size_t max_queued) : max_queued_(max_queued) {
  PS_CHECK(num_threads > 0);
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

AsyncExecutor::~AsyncExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

bool AsyncExecutor::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return true;
}

void AsyncExecutor::worker_loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace peerserve
