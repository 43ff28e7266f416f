#include "bench/ceilings/compute_loops.h"

namespace peerserve::bench::internal {

float fma_loop_scalar(int64_t iterations) {
  float acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = static_cast<float>(c);
  for (int64_t i = 0; i < iterations; ++i) {
    for (float& a : acc) a = a * 0.999999f + 1e-6f;
  }
  float sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

float read_sum_scalar(const float* begin, const float* end) {
  float acc[8] = {};
  const float* p = begin;
  for (; p + 8 <= end; p += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += p[l];
  }
  float total = 0;
  for (float a : acc) total += a;
  for (; p < end; ++p) total += *p;
  return total;
}

}  // namespace peerserve::bench::internal
