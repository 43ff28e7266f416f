#include "dist/call_watchdog.h"

#include <cstdio>
#include <cstdlib>

#include "base/steady_clock_ns.h"

namespace peerserve::dist {
CallWatchdog::CallWatchdog(std::string who, std::chrono::milliseconds period)
    : who_(std::move(who)), period_(period), thread_([this] { watch(); }) {}

CallWatchdog::~CallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

CallWatchdog::Guard CallWatchdog::guard(const char* call, int peer,
                                        std::chrono::milliseconds timeout) {
  call_.store(call, std::memory_order_relaxed);
  peer_.store(peer, std::memory_order_relaxed);
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  // Release: the watch thread that sees the deadline sees the fields above.
  deadline_ns_.store(steady_clock_ns() + std::chrono::nanoseconds(timeout).count(),
                     std::memory_order_release);
  return Guard(this);
}

void CallWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    const int64_t deadline = deadline_ns_.load(std::memory_order_acquire);
    if (deadline == 0 || steady_clock_ns() <= deadline) continue;
    // The guarded thread is inside the library and cannot be interrupted: report and end
    // the process (not exit(): destructors would tear down what that thread is using).
    std::fprintf(stderr, "%s: error: rank %d did not complete %s within %lld ms (lost?); exiting\n",
                 who_.c_str(), peer_.load(std::memory_order_relaxed),
                 call_.load(std::memory_order_relaxed),
                 static_cast<long long>(timeout_ms_.load(std::memory_order_relaxed)));
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace peerserve::dist
