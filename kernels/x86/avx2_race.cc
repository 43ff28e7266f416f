#include <immintrin.h>

#include "kernels/internal/race_uniforms_x86.h"
#include "kernels/race_uniforms.h"

namespace peerserve::kernels::internal {
namespace {

// a * c mod 2^64 per lane, from 32 x 32 -> 64-bit products (AVX2 has no 64-bit multiply).
__m256i mul64(__m256i a, uint64_t c) {
  const __m256i c_lo = _mm256_set1_epi64x(static_cast<long long>(c & 0xFFFFFFFFULL));
  const __m256i c_hi = _mm256_set1_epi64x(static_cast<long long>(c >> 32));
  const __m256i lo_lo = _mm256_mul_epu32(a, c_lo);
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo), _mm256_mul_epu32(a, c_hi));
  return _mm256_add_epi64(lo_lo, _mm256_slli_epi64(cross, 32));
}

// An unsigned integer below 2^53 to double, exactly: its two 32-bit halves through the
// 2^52 and 2^84 exponent tricks, added (the sum is exact below 2^53).
__m256d to_double(__m256i v) {
  const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi64x(0xFFFFFFFFLL)),
                                     _mm256_set1_epi64x(0x4330000000000000LL));
  const __m256i hi =
      _mm256_or_si256(_mm256_srli_epi64(v, 32), _mm256_set1_epi64x(0x4530000000000000LL));
  const __m256d hi_d = _mm256_sub_pd(_mm256_castsi256_pd(hi), _mm256_set1_pd(0x1.0p84));
  const __m256d lo_d = _mm256_sub_pd(_mm256_castsi256_pd(lo), _mm256_set1_pd(0x1.0p52));
  return _mm256_add_pd(hi_d, lo_d);
}

}  // namespace

size_t race_candidates_avx2(const float* weight, size_t n, uint64_t base, double bar,
                            uint32_t* out) {
  __m256i x = _mm256_setr_epi64x(static_cast<long long>(base + kRaceGolden * 1),
                                 static_cast<long long>(base + kRaceGolden * 2),
                                 static_cast<long long>(base + kRaceGolden * 3),
                                 static_cast<long long>(base + kRaceGolden * 4));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(kRaceGolden * 4));
  const __m256d half = _mm256_set1_pd(0.5), scale = _mm256_set1_pd(0x1.0p-53);
  const __m256d one = _mm256_set1_pd(1.0), bars = _mm256_set1_pd(bar);
  const __m256d below_one = _mm256_set1_pd(kRaceBelowOne);
  const __m256d zero = _mm256_setzero_pd();
  size_t count = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    __m256i h = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
    h = mul64(h, 0xBF58476D1CE4E5B9ULL);
    h = _mm256_xor_si256(h, _mm256_srli_epi64(h, 27));
    h = mul64(h, 0x94D049BB133111EBULL);
    h = _mm256_xor_si256(h, _mm256_srli_epi64(h, 31));
    const __m256d u = _mm256_min_pd(
        _mm256_mul_pd(_mm256_add_pd(to_double(_mm256_srli_epi64(h, 11)), half), scale), below_one);
    const __m256d w = _mm256_cvtps_pd(_mm_loadu_ps(weight + i));
    const __m256d keep =
        _mm256_and_pd(_mm256_cmp_pd(w, zero, _CMP_GT_OQ),
                      _mm256_cmp_pd(_mm256_mul_pd(_mm256_sub_pd(one, u), bars), w, _CMP_LT_OQ));
    int mask = _mm256_movemask_pd(keep);
    while (mask != 0) {
      const int lane = __builtin_ctz(static_cast<unsigned>(mask));
      out[count++] = static_cast<uint32_t>(i + static_cast<size_t>(lane));
      mask &= mask - 1;
    }
    x = _mm256_add_epi64(x, step);
  }
  return count;
}

}  // namespace peerserve::kernels::internal
