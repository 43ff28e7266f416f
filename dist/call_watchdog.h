// Bounds library calls that take no timeout. MPI_Win_flush to a peer that died blocks
// forever in some transports (osc/pt2pt over TCP spins in it), and no MPI call can cancel
// another, so a dead peer would hang the survivors. A CallWatchdog's thread checks a few
// times a second whether the guarded call has run past its deadline; if it has, it prints
// which call waited on which rank and ends the process with exit status 1. The group is
// broken by then anyway: the experts of the lost rank are gone.
//
// Arming and disarming are two atomic stores (no lock, no allocation), so every put and
// flush of a step can be guarded. One call is guarded at a time (the communicator's thread).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace peerserve::dist {

class CallWatchdog {
 public:
  // `who` prefixes the message ("rank 1 of 4"); `period` is how often the deadline is checked.
  explicit CallWatchdog(std::string who,
                        std::chrono::milliseconds period = std::chrono::milliseconds(50));
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // Disarms on destruction. `call` must outlive the guard (a string literal).
  class Guard {
   public:
    ~Guard() { owner_->disarm(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    friend class CallWatchdog;
    explicit Guard(CallWatchdog* owner) : owner_(owner) {}
    CallWatchdog* owner_;
  };

  // Until the guard goes, a call running longer than `timeout` ends the process, naming
  // `call` and the rank `peer` it waits on.
  [[nodiscard]] Guard guard(const char* call, int peer, std::chrono::milliseconds timeout);

 private:
  void disarm() { deadline_ns_.store(0, std::memory_order_release); }
  void watch();

  const std::string who_;
  const std::chrono::milliseconds period_;
  std::atomic<int64_t> deadline_ns_{0};  // steady_clock nanoseconds; 0 = nothing guarded
  std::atomic<const char*> call_{nullptr};
  std::atomic<int> peer_{-1};
  std::atomic<int64_t> timeout_ms_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace peerserve::dist
