// AVX2 loops of quantize_rows_int8 (kernels/internal/quantize_rows_x86.h). Tails go through
// a zero-padded block so that every element takes the vector path: a scalar tail compiled
// with -mfma could contract the scalar loop's multiply and add into one rounding.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/internal/quantize_rows_x86.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kBlock = 32;  // floats per loop step

__m256i abs_bits(const float* x) {
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)),
                          _mm256_set1_epi32(0x7fffffff));
}

// 32 values -> 32 int8: round to nearest even (cvtps in the default rounding mode), then two
// saturating packs (values are within +-127) and one permute to undo the packs' per-lane
// interleave.
void scale_round_block(const float* x, __m256 scale, int8_t* q) {
  const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), scale));
  const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), scale));
  const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), scale));
  const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), scale));
  // Dwords of the packed bytes: a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(q),
      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

}  // namespace

uint32_t max_abs_bits_avx2(const float* x, int64_t n) {
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  auto step = [&](const float* p) {
    m0 = _mm256_max_epu32(m0, abs_bits(p));
    m1 = _mm256_max_epu32(m1, abs_bits(p + 8));
    m2 = _mm256_max_epu32(m2, abs_bits(p + 16));
    m3 = _mm256_max_epu32(m3, abs_bits(p + 24));
  };
  int64_t k = 0;
  for (; k + kBlock <= n; k += kBlock) step(x + k);
  if (k < n) {
    float tail[kBlock] = {};  // zeros leave the maximum alone
    std::memcpy(tail, x + k, static_cast<size_t>(n - k) * sizeof(float));
    step(tail);
  }
  const __m256i m = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
}

void scale_round_int8_avx2(const float* x, int64_t n, float inverse, int8_t* q) {
  const __m256 scale = _mm256_set1_ps(inverse);
  int64_t k = 0;
  for (; k + kBlock <= n; k += kBlock) scale_round_block(x + k, scale, q + k);
  if (k < n) {
    float tail[kBlock] = {};
    int8_t out[kBlock];
    std::memcpy(tail, x + k, static_cast<size_t>(n - k) * sizeof(float));
    scale_round_block(tail, scale, out);
    std::memcpy(q + k, out, static_cast<size_t>(n - k));
  }
}

}  // namespace peerserve::kernels::internal
