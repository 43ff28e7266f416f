#include <immintrin.h>

#include "bench/ceilings/compute_loops.h"

namespace peerserve::bench::internal {

float fma_loop_avx2(int64_t iterations) {
  __m256 acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

float read_sum_avx2(const float* begin, const float* end) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const float* p = begin;
  // 128 bytes per iteration, four independent adds.
  for (; p + 32 <= end; p += 32) {
    acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(p));
    acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(p + 8));
    acc2 = _mm256_add_ps(acc2, _mm256_loadu_ps(p + 16));
    acc3 = _mm256_add_ps(acc3, _mm256_loadu_ps(p + 24));
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  for (; p < end; ++p) total += *p;
  return total;
}

}  // namespace peerserve::bench::internal
