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

int32_t int8_madd_loop_avx2(int64_t iterations) {
  __m256i acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i ones = _mm256_set1_epi16(1);
  // A weight vector per chain, read from memory as the kernel reads its weight panels: with
  // one shared weight every chain computed the same products, which the compiler computed
  // once (the loop then timed the adds, ~1.4x the real multiply rate on a Zen 5).
  alignas(32) int8_t weights[kFmaChains][32];
  for (int c = 0; c < kFmaChains; ++c) {
    for (int j = 0; j < 32; ++j) weights[c][j] = static_cast<int8_t>(c - 2 * j + 7);
  }
  // Fresh sign operand per iteration (as the kernel's broadcast activations), so that the
  // vpsignb cannot be hoisted out of the loop.
  __m256i x = _mm256_set1_epi8(3);
  const __m256i step = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < iterations; ++i) {
    const __m256i ax = _mm256_abs_epi8(x);
#pragma GCC unroll 16
    for (int c = 0; c < kFmaChains; ++c) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(weights[c]));
      const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(pairs, ones));
    }
    x = _mm256_xor_si256(x, step);
  }
  __m256i sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int32_t total = 0;
  for (int32_t v : lanes) total += v;
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
