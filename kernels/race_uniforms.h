// The per-token uniforms of the exponential race that samples a token (runtime/sampler.cc)
// and the race's cheap first filter, vectorized.
//
// The race picks the kept token i with the largest weight[i] / E_i, E_i = -ln U_i, where
// U_i = race_uniform(base, i) is a counter-based hash (SplitMix64 over the token index) of a
// per-draw `base`. Since E_i >= 1 - U_i, token i can beat a bar b only if
// (1 - U_i) * b < weight[i]: race_candidates lists those tokens, so that the logarithm is
// taken for few of them. AVX-512 and AVX2 loops at those levels, plain loops otherwise, with
// bitwise the same results. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/splitmix64.h"

namespace peerserve::kernels {

inline constexpr uint64_t kRaceGolden = kSplitMix64Gamma;

// The largest double below 1.
inline constexpr double kRaceBelowOne = 0x1.fffffffffffffp-1;

// U in (0, 1), never 0 or 1: ((hash >> 11) + 0.5) / 2^53, at most kRaceBelowOne (for the
// largest hash, 2^53 - 0.5 is a tie that rounds to 2^53: U was 1 and -ln U = -0).
inline double race_uniform(uint64_t base, uint64_t token) {
  const double u =
      (static_cast<double>(splitmix64_mix(base + kRaceGolden * (token + 1)) >> 11) + 0.5) *
      0x1.0p-53;
  return u < kRaceBelowOne ? u : kRaceBelowOne;
}

// Writes to `out` (room for n) the tokens i in [0, n), ascending, with weight[i] > 0 and
// (1 - race_uniform(base, i)) * bar < weight[i]; returns how many. REQUIRES: n < 2^32.
size_t race_candidates(const float* weight, size_t n, uint64_t base, double bar, uint32_t* out);

}  // namespace peerserve::kernels
