#include <immintrin.h>

#include "kernels/internal/race_uniforms_x86.h"
#include "kernels/race_uniforms.h"

namespace peerserve::kernels::internal {

size_t race_candidates_avx512(const float* weight, size_t n, uint64_t base, double bar,
                              uint32_t* out) {
  // Eight tokens a lane each: SplitMix64 with 64-bit multiplies (AVX-512DQ), the top 53 bits
  // converted exactly, then the filter in double as race_uniform's scalar code computes it.
  const __m512i c1 = _mm512_set1_epi64(static_cast<long long>(0xBF58476D1CE4E5B9ULL));
  const __m512i c2 = _mm512_set1_epi64(static_cast<long long>(0x94D049BB133111EBULL));
  const __m512i step = _mm512_set1_epi64(static_cast<long long>(kRaceGolden * 8));
  __m512i x =
      _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(base)),
                       _mm512_mullo_epi64(_mm512_set1_epi64(static_cast<long long>(kRaceGolden)),
                                          _mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 8)));
  const __m512d half = _mm512_set1_pd(0.5), scale = _mm512_set1_pd(0x1.0p-53);
  const __m512d one = _mm512_set1_pd(1.0), bars = _mm512_set1_pd(bar);
  const __m512d below_one = _mm512_set1_pd(kRaceBelowOne);
  const __m512d zero = _mm512_setzero_pd();
  __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  size_t count = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    __m512i h = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
    h = _mm512_mullo_epi64(h, c1);
    h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 27));
    h = _mm512_mullo_epi64(h, c2);
    h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 31));
    const __m512d u = _mm512_min_pd(
        _mm512_mul_pd(_mm512_add_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(h, 11)), half), scale),
        below_one);
    const __m512d w = _mm512_cvtps_pd(_mm256_loadu_ps(weight + i));
    const __mmask8 keep =
        _mm512_cmp_pd_mask(w, zero, _CMP_GT_OQ) &
        _mm512_cmp_pd_mask(_mm512_mul_pd(_mm512_sub_pd(one, u), bars), w, _CMP_LT_OQ);
    _mm256_mask_compressstoreu_epi32(out + count, keep, index);
    count += static_cast<size_t>(__builtin_popcount(keep));
    x = _mm512_add_epi64(x, step);
    index = _mm256_add_epi32(index, eight);
  }
  return count;
}

}  // namespace peerserve::kernels::internal
