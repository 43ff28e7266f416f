#include <immintrin.h>

#include "bench/ceilings/compute_loops.h"

namespace peerserve::bench::internal {

float fma_loop_avx512(int64_t iterations) {
  __m512 acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  // acc = acc * a + b stays finite and normal: a slightly below 1, b small.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

float bf16_dot_loop_avx512(int64_t iterations) {
  __m512 acc[kFmaChains];
  // Distinct starting values: identical chains could be merged by the compiler into one.
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  // Pairs of small bf16 values (0x3c00 ~ 2^-7): sums grow slowly and stay finite.
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3c00));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3c00));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

int32_t int8_dot_loop_avx512_vnni(int64_t iterations) {
  __m512i acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_set1_epi32(c);
  // Small operands: the int32 sums wrap harmlessly (only the instruction rate matters).
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  return _mm512_reduce_add_epi32(sum);
}

}  // namespace peerserve::bench::internal
