#include <immintrin.h>

#include "kernels/internal/quantize_rows_x86.h"

namespace peerserve::kernels::internal {

uint32_t max_abs_bits_avx512(const float* x, int64_t n) {
  const __m512i sign_cleared = _mm512_set1_epi32(0x7fffffff);
  __m512i max = _mm512_setzero_si512();
  int64_t k = 0;
  // Four accumulators: independent max chains keep both load ports busy.
  __m512i max1 = max, max2 = max, max3 = max;
  for (; k + 64 <= n; k += 64) {
    max = _mm512_max_epu32(max, _mm512_and_si512(_mm512_loadu_si512(x + k), sign_cleared));
    max1 = _mm512_max_epu32(max1, _mm512_and_si512(_mm512_loadu_si512(x + k + 16), sign_cleared));
    max2 = _mm512_max_epu32(max2, _mm512_and_si512(_mm512_loadu_si512(x + k + 32), sign_cleared));
    max3 = _mm512_max_epu32(max3, _mm512_and_si512(_mm512_loadu_si512(x + k + 48), sign_cleared));
  }
  max = _mm512_max_epu32(_mm512_max_epu32(max, max1), _mm512_max_epu32(max2, max3));
  for (; k + 16 <= n; k += 16) {
    const __m512i bits = _mm512_and_si512(_mm512_loadu_si512(x + k), sign_cleared);
    max = _mm512_max_epu32(max, bits);
  }
  if (k < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - k)) - 1);
    const __m512i bits = _mm512_and_si512(_mm512_maskz_loadu_epi32(mask, x + k), sign_cleared);
    max = _mm512_max_epu32(max, bits);
  }
  return _mm512_reduce_max_epu32(max);
}

void scale_round_int8_avx512(const float* x, int64_t n, float inverse, int8_t* q) {
  const __m512 scale = _mm512_set1_ps(inverse);
  auto convert = [&](__m512 v) {
    // mul then round (no FMA): the same two roundings as the scalar loop.
    const __m512 rounded = _mm512_roundscale_ps(_mm512_mul_ps(v, scale),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rounded));
  };
  int64_t k = 0;
  // 64 at a time: two saturating packs per four vectors instead of four narrowing moves
  // (the same signed saturation; values are within +-127 anyway), then one permute to undo
  // the packs' per-128-bit-lane interleave. Rounding by cvtps (the current rounding mode,
  // nearest-even by default) gives the same integers as roundscale + cvtps.
  const __m512i lane_order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (; k + 64 <= n; k += 64) {
    const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), scale));
    const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 16), scale));
    const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 32), scale));
    const __m512i d = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 48), scale));
    const __m512i packed = _mm512_packs_epi16(_mm512_packs_epi32(a, b), _mm512_packs_epi32(c, d));
    _mm512_storeu_si512(q + k, _mm512_permutexvar_epi32(lane_order, packed));
  }
  for (; k + 16 <= n; k += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), convert(_mm512_loadu_ps(x + k)));
  }
  if (k < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - k)) - 1);
    _mm_mask_storeu_epi8(q + k, mask, convert(_mm512_maskz_loadu_ps(mask, x + k)));
  }
}

}  // namespace peerserve::kernels::internal
