// Random numbers that are bit-identical on every machine and compiler: SplitMix64 for the
// integers and a Box-Muller transform whose log/cos are our own polynomial evaluations in
// plain IEEE double arithmetic (libm's results may differ in the last bit between platforms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace peerserve {

class DeterministicNormal {
 public:
  explicit DeterministicNormal(uint64_t seed) : state_(seed) {}

  // The generator a fresh DeterministicNormal(seed) is after `index` calls of next_normal()
  // (SplitMix64 can jump: every Box-Muller pair takes exactly two next_u64 values), so that
  // parts of one stream can be generated on different threads.
  static DeterministicNormal at_normal_index(uint64_t seed, uint64_t index);

  uint64_t next_u64();
  // Uniform in (0, 1], 53 bits.
  double next_uniform();
  // Standard normal.
  double next_normal();
  // The next out.size() values of next_normal(), bit for bit, leaving the same state as
  // that many calls would; several times faster (many Box-Muller pairs at once, with AVX-512
  // or AVX2 where the CPU has them: the same IEEE operations in the same order, no FMA).
  void next_normals(std::span<double> out);

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Deterministic replacements for std::log and std::cos (accurate to ~1e-15).
double deterministic_log(double x);      // REQUIRES: x > 0, finite
double deterministic_cos_2pi(double t);  // cos(2*pi*t)
double deterministic_sin_2pi(double t);  // sin(2*pi*t)

// Tests only: next_normals uses at most this many SIMD lanes (8: AVX-512, 4: AVX2, 1: scalar;
// never more than the CPU has). Returns the previous cap. Default 8.
int set_normal_simd_width_cap_for_testing(int width);

}  // namespace peerserve
