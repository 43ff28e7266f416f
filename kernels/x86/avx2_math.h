// AVX2 building blocks: bf16 widening and rounding that agree bit for bit with
// tensor/float_convert.h, the canonical 8-lane reduction, partial loads, and exp.
// Internal linkage on purpose (see internal/kernel_table.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

// 8 bf16 (raw bits) -> 8 fp32.
inline __m256 widen_bf16(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// As round_bf16_bits in avx512_math.h.
inline __m256i round_bf16_bits(__m256i u) {
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  // Signed compare is fine: abs is non-negative.
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), high);
}

// Lane sum in the fixed halving order: lanes (l, l+4), then (l, l+2), (l, l+1).
inline float reduce_add(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// Mask of the first `count` (0..8) int32 lanes, for maskload/maskstore.
inline __m256i first_lanes(int count) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - count));
}

// reduce_add of 8 vectors at once, every addition with the same two operands as in
// reduce_add; lane p of the result holds the sum of v[transposed_lane(p)].
inline __m256 reduce_add_8_transposed(const __m256* v) {
  __m256 s1[4], s2[2];
  for (int i = 0; i < 4; ++i) {  // (l, l + 4): 128-bit halves
    s1[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                          _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  }
  for (int i = 0; i < 2; ++i) {  // (l, l + 2)
    s2[i] = _mm256_add_ps(_mm256_shuffle_ps(s1[2 * i], s1[2 * i + 1], 0x44),
                          _mm256_shuffle_ps(s1[2 * i], s1[2 * i + 1], 0xEE));
  }
  // (l, l + 1)
  return _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], 0x88),
                       _mm256_shuffle_ps(s2[0], s2[1], 0xDD));
}

// The lane of reduce_add_8_transposed's result that holds the sum of v[a] (and back).
constexpr int transposed_lane(int a) {
  return 4 * (a % 2) + a / 2;
}

template <int NR>
struct RowGather {
  int32_t lanes[8 / NR][8];
  constexpr RowGather() : lanes{} {
    for (int r = 0; r < 8 / NR; ++r) {
      for (int l = 0; l < 8; ++l) lanes[r][l] = l < NR ? transposed_lane(r * NR + l) : 0;
    }
  }
};

// y[i * y_stride + j] (+)= reduce_add(acc[i][j]) for an MR x NR block (as in avx512_math.h).
template <int MR, int NR>
inline void store_block_sums(const __m256 (&acc)[MR][NR], float* y, int64_t y_stride,
                             bool accumulate) {
  static_assert(NR <= 8);
  if constexpr (MR * NR < 4) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) {
        const float s = reduce_add(acc[i][j]);
        float& out = y[i * y_stride + j];
        out = accumulate ? out + s : s;
      }
    }
  } else {
    constexpr int kRowsPerGroup = 8 / NR;
    const __m256i row_mask = first_lanes(NR);
#pragma GCC unroll 4
    for (int r0 = 0; r0 < MR; r0 += kRowsPerGroup) {
      __m256 group[8];
#pragma GCC unroll 8
      for (int a = 0; a < 8; ++a) {
        const int r = r0 + a / NR;
        group[a] = a < kRowsPerGroup * NR && r < MR ? acc[r][a % NR] : _mm256_setzero_ps();
      }
      const __m256 sums = reduce_add_8_transposed(group);
#pragma GCC unroll 4
      for (int r = r0; r < r0 + kRowsPerGroup; ++r) {
        if (r >= MR) break;
        static constexpr RowGather<NR> kGather{};
        const __m256 row = _mm256_permutevar8x32_ps(
            sums, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kGather.lanes[r - r0])));
        float* y_row = y + r * y_stride;
        _mm256_maskstore_ps(
            y_row, row_mask,
            accumulate ? _mm256_add_ps(_mm256_maskload_ps(y_row, row_mask), row) : row);
      }
    }
  }
}

inline float sqrt_ss(float v) {
  return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(v)));
}

inline __m256 load_part(const float* p, int count) {
  return _mm256_maskload_ps(p, first_lanes(count));
}

inline __m256 load_part(const uint16_t* p, int count) {
  uint16_t buffer[8] = {};
  std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(uint16_t));
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buffer)));
}

inline void store_part(float* p, __m256 v, int count) {
  _mm256_maskstore_ps(p, first_lanes(count), v);
}

// exp(x) as in avx512_math.h, with 2^n built in the exponent bits of two factors 2^(n/2)
// and 2^(n - n/2) (n reaches 128 just below the overflow threshold, past any one normal
// exponent): x is clamped to [-87, 88.72], the result set to 0 below -87 (true value
// < 1.7e-38) and to inf above 88.72. NaN stays NaN.
inline __m256 exp_ps(__m256 x_in) {
  constexpr float kOverflow = 88.72283935546875f;  // exp(x) > FLT_MAX above
  __m256 x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x_in);
  x = _mm256_min_ps(_mm256_set1_ps(kOverflow), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  // Scaling by powers of two is exact, so the two factors give the bits of one 2^n.
  const __m256i n_all = _mm256_cvtps_epi32(n);
  const __m256i n_half = _mm256_srai_epi32(n_all, 1);
  auto power_of_two = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, power_of_two(n_half)),
                                power_of_two(_mm256_sub_epi32(n_all, n_half)));
  result = _mm256_andnot_ps(_mm256_cmp_ps(x_in, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), result);
  return _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()),
                          _mm256_cmp_ps(x_in, _mm256_set1_ps(kOverflow), _CMP_GT_OQ));
}

}  // namespace
}  // namespace peerserve::kernels::internal
