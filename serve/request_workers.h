// RequestWorkers: the threads that turn request bodies into engine requests (JSON parsing,
// chat templating, tokenization), so that the HTTP event loop only moves bytes and a
// megabyte prompt never delays /health or another client's stream. A bounded FIFO queue
// in front of them; work that does not fit is refused at once (the caller answers 503).
//
// Thread-safety: submit() from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace peerserve {

class RequestWorkers {
 public:
  // num_threads >= 1; max_queued >= 1 tasks waiting at most.
  RequestWorkers(int num_threads, size_t max_queued);
  // Runs what is queued, then joins.
  ~RequestWorkers();
  RequestWorkers(const RequestWorkers&) = delete;
  RequestWorkers& operator=(const RequestWorkers&) = delete;

  // Queues `task`; false (nothing queued) when the queue is full.
  bool submit(std::function<void()> task);

 private:
  void loop();

  const size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace peerserve
