// The steady clock as a count of nanoseconds: a time that fits in a std::atomic<int64_t>
// (a time_point does not), for timestamps shared between threads.
#pragma once

#include <chrono>
#include <cstdint>

namespace peerserve {

inline int64_t steady_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace peerserve
