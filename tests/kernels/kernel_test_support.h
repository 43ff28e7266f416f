// Shared helpers for the kernel tests: random data, the ISA levels to run, and the
// floating-point error bounds the tolerances come from.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels::testing {

// Unit roundoff of fp32 (round to nearest).
inline constexpr double kUnitRoundoff = 0x1p-24;

// fp32 lanes that sum independently at a level (the scalar path is one sequential sum).
inline int64_t lanes_of(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return 1;
    case IsaLevel::kAvx2:
      return 8;
    default:
      return 16;
  }
}

// Longest chain of fp32 roundings that any one lane of a length-n sum goes through at this
// level: n / lanes steps (two roundings per step for vdpbf16ps pairs, counted as 2), then
// the halving tree over the lanes, then a final accumulate into y. The standard bound
// |fl(sum) - sum| <= chain * u * sum |terms| (Higham, Accuracy and Stability, §4.2;
// first order, chain * u << 1) turns it into a tolerance.
inline double summation_chain(IsaLevel level, int64_t n) {
  const int64_t lanes = lanes_of(level);
  return 2.0 * static_cast<double>((n + lanes - 1) / lanes) + 6.0;
}

inline std::vector<IsaLevel> levels_to_test() {
  return supported_isa_levels();
}

inline std::string level_label(IsaLevel level) {
  return "isa=" + std::string(isa_level_name(level));
}

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  float uniform(float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(engine_);
  }
  std::vector<float> floats(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& f : v) f = uniform(lo, hi);
    return v;
  }
  std::vector<bf16> bf16s(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<bf16> v(n);
    for (bf16& b : v) b = float_to_bf16(uniform(lo, hi));
    return v;
  }
  uint32_t bits() { return static_cast<uint32_t>(engine_()); }

 private:
  std::mt19937_64 engine_;
};

// Runs `body` on a thread of its own and waits at most `limit` for it: a kernel loop that
// never advances fails with a message naming `what` instead of hanging the suite. A hung
// thread cannot be stopped, so the process ends there.
template <typename Body>
void run_with_deadline(const std::string& what, std::chrono::seconds limit, Body&& body) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread([&body, &done] {
    body();
    done.set_value();
  }).detach();
  if (finished.wait_for(limit) == std::future_status::ready) return;
  ADD_FAILURE() << what << " did not end within " << limit.count() << " s";
  std::fprintf(stderr, "%s did not end within %lld s: exiting\n", what.c_str(),
               static_cast<long long>(limit.count()));
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace peerserve::kernels::testing
