// AVX-512 building blocks shared by the AVX-512 files: bf16 widening and rounding that
// agree bit for bit with tensor/float_convert.h, the canonical lane reduction, and exp.
// Internal linkage on purpose (see internal/kernel_table.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

// 16 bf16 (raw bits) -> 16 fp32: the bits become the high half of each float.
inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// fp32 bits -> the bits of the nearest bf16 value (ties to even) in the high half, low half
// zero; NaN stays NaN with the quiet bit set. Same as float_to_bf16 (no flushing).
inline __m512i round_bf16_bits(__m512i u) {
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  return _mm512_and_si512(_mm512_mask_mov_epi32(rounded, nan, quiet), high);
}

// Lane sum in the fixed halving order: lanes (l, l+8), then (l, l+4), (l, l+2), (l, l+1).
inline float reduce_add(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// reduce_add of 16 vectors at once, every addition with the same two operands as in
// reduce_add (so each sum is bit for bit the same); 45 shuffles and adds instead of 16 x 7.
// Lane p of the result holds the sum of v[transposed_lane(p)] (a 4 x 4 transpose).
inline __m512 reduce_add_16_transposed(const __m512* v) {
  __m512 s1[8], s2[4], s3[2];
  for (int i = 0; i < 8; ++i) {  // (l, l + 8): 256-bit halves of v[2i] and v[2i+1]
    s1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                          _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // (l, l + 4): 128-bit blocks 0,2 against 1,3
    s2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // (l, l + 2) within each block
    s3[i] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], 0x44),
                          _mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], 0xEE));
  }
  // (l, l + 1)
  return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88),
                       _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
}

// The lane of reduce_add_16_transposed's result that holds the sum of v[a] (an involution).
constexpr int transposed_lane(int a) {
  return 4 * (a % 4) + a / 4;
}

// Permutation indices for rows of NR sums packed 16 / NR to a batched reduction: row r's
// sums (of v[r * NR], ..., v[r * NR + NR - 1]) go to lanes 0 .. NR-1.
template <int NR>
struct RowGather {
  int32_t lanes[16 / NR][16];
  constexpr RowGather() : lanes{} {
    for (int r = 0; r < 16 / NR; ++r) {
      for (int l = 0; l < 16; ++l) lanes[r][l] = l < NR ? transposed_lane(r * NR + l) : 0;
    }
  }
};

// y[i * y_stride + j] (+)= reduce_add(acc[i][j]) for an MR x NR block: rows are packed
// 16 / NR to a batched reduction, and each row of y is updated with one masked vector
// load/add/store (y = y + sum, the same single addition as the scalar form).
template <int MR, int NR>
inline void store_block_sums(const __m512 (&acc)[MR][NR], float* y, int64_t y_stride,
                             bool accumulate) {
  static_assert(NR <= 16);
  if constexpr (MR * NR < 6) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) {
        const float s = reduce_add(acc[i][j]);
        float& out = y[i * y_stride + j];
        out = accumulate ? out + s : s;
      }
    }
  } else {
    constexpr int kRowsPerGroup = 16 / NR;
    constexpr __mmask16 kRowMask = static_cast<__mmask16>((1u << NR) - 1u);
#pragma GCC unroll 4
    for (int r0 = 0; r0 < MR; r0 += kRowsPerGroup) {
      __m512 group[16];
#pragma GCC unroll 16
      for (int a = 0; a < 16; ++a) {
        const int r = r0 + a / NR;
        group[a] = a < kRowsPerGroup * NR && r < MR ? acc[r][a % NR] : _mm512_setzero_ps();
      }
      const __m512 sums = reduce_add_16_transposed(group);
#pragma GCC unroll 4
      for (int r = r0; r < r0 + kRowsPerGroup; ++r) {
        if (r >= MR) break;
        static constexpr RowGather<NR> kGather{};
        const __m512 row = _mm512_permutexvar_ps(_mm512_loadu_si512(kGather.lanes[r - r0]), sums);
        float* y_row = y + r * y_stride;
        _mm512_mask_storeu_ps(
            y_row, kRowMask,
            accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(kRowMask, y_row), row) : row);
      }
    }
  }
}

inline float sqrt_ss(float v) {
  return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(v)));
}

// exp(x), within 2 ulp of the correctly rounded value (Cephes expf polynomial; range
// reduction by n = round(x / ln 2), scaling by 2^n with vscalefps, which gives 0 below
// the subnormal range and inf above FLT_MAX). NaN stays NaN.
inline __m512 exp_ps(__m512 x) {
  // max/min take the second operand when one is NaN, so a NaN x passes through.
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace
}  // namespace peerserve::kernels::internal
