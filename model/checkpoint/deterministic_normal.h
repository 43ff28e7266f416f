// Random numbers that are bit-identical on every machine and compiler: SplitMix64 for the
// integers and a Box-Muller transform whose log/cos are our own polynomial evaluations in
// plain IEEE double arithmetic (libm's results may differ in the last bit between platforms).
#pragma once

#include <cstdint>

namespace peerserve {

class DeterministicNormal {
 public:
  explicit DeterministicNormal(uint64_t seed) : state_(seed) {}

  uint64_t next_u64();
  // Uniform in (0, 1], 53 bits.
  double next_uniform();
  // Standard normal.
  double next_normal();

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Deterministic replacements for std::log and std::cos (accurate to ~1e-15).
double deterministic_log(double x);      // REQUIRES: x > 0, finite
double deterministic_cos_2pi(double t);  // cos(2*pi*t)
double deterministic_sin_2pi(double t);  // sin(2*pi*t)

}  // namespace peerserve
