#include "serve/request_workers.h"

#include <algorithm>

namespace peerserve {

RequestWorkers::RequestWorkers(int num_threads, size_t max_queued)
    : max_queued_(std::max<size_t>(max_queued, 1)) {
  for (int i = 0; i < std::max(num_threads, 1); ++i) threads_.emplace_back([this] { loop(); });
}

RequestWorkers::~RequestWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool RequestWorkers::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return true;
}

void RequestWorkers::loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace peerserve
