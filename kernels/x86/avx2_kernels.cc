// AVX2 + FMA kernels: 8-lane fp32 multiply-add. Compiled with -mavx2 -mfma; see
// internal/kernel_table.h for why nothing here calls inline code from other headers.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/avx2_math.h"
#include "kernels/x86/fma_matmul.h"

namespace peerserve::kernels::internal {
namespace {

struct Avx2Ops {
  using Reg = __m256;
  static constexpr int64_t kLanes = 8;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load_x(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_x_part(const float* p, int count) { return load_part(p, count); }
  static Reg load_w(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_w_part(const float* p, int count) { return load_part(p, count); }
  static Reg load_w(const uint16_t* p) {
    return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Reg load_w_part(const uint16_t* p, int count) { return load_part(p, count); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  template <int MR, int NR>
  static void store_sums(const Reg (&acc)[MR][NR], float* y, int64_t y_stride, bool accumulate) {
    store_block_sums<MR, NR>(acc, y, y_stride, accumulate);
  }
};

// ---- matmul: 16 ymm registers allow 3 x 4 accumulators + 4 weights ----

void matmul_f32_bf16(const MatmulTile& t) {
  if (t.m == 1) {
    fma_tile<Avx2Ops, 1, 8, float, uint16_t>(t);
  } else {
    fma_tile<Avx2Ops, 3, 4, float, uint16_t>(t);
  }
}

void matmul_f32_f32(const MatmulTile& t) {
  if (t.m == 1) {
    fma_tile<Avx2Ops, 1, 8, float, float>(t);
  } else {
    fma_tile<Avx2Ops, 3, 4, float, float>(t);
  }
}

// ---- conversions ----

void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  if (i < n)
    store_part(dst + i, load_part(src + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

// 8 rounded bf16 bit patterns, packed into the low 128 bits.
__m128i round_pack(__m256i u) {
  const __m256i hi = _mm256_srli_epi32(round_bf16_bits(u), 16);
  // packus works per 128-bit lane: [a0..a3, a0..a3, b0..b3, b0..b3] -> pick qwords 0 and 2.
  const __m256i packed = _mm256_packus_epi32(hi, hi);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// The rounded high halves of 8 values without NaNs, in the low 16 bits of each lane.
__m256i rounded_high_halves(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
                           16);
}

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  // 16 at a time, one pack and one permute for both vectors; a block holding a NaN (which
  // must be quieted, not rounded) goes 8 at a time through round_pack.
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
    const __m256 nan =
        _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    if (!_mm256_testz_ps(nan, nan)) [[unlikely]] {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), round_pack(_mm256_castps_si256(a)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 8), round_pack(_mm256_castps_si256(b)));
      continue;
    }
    // packus per 128-bit lane: a0-3 b0-3 | a4-7 b4-7; then qwords 0, 2, 1, 3.
    const __m256i packed = _mm256_packus_epi32(rounded_high_halves(a), rounded_high_halves(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     round_pack(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    uint16_t buffer[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buffer),
                     round_pack(_mm256_castps_si256(load_part(src + i, rest))));
    std::memcpy(dst + i, buffer, static_cast<size_t>(rest) * sizeof(uint16_t));
  }
}

void round_to_bf16(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + i),
        round_bf16_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_part(dst + i,
               _mm256_castsi256_ps(round_bf16_bits(_mm256_castps_si256(load_part(src + i, rest)))),
               rest);
  }
}

// ---- vector ops ----

__m256 load_f(const float* p) {
  return _mm256_loadu_ps(p);
}
__m256 load_f(const uint16_t* p) {
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <typename B>
float dot(const float* a, const B* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(load_f(a + i), load_f(b + i), acc0);
    acc1 = _mm256_fmadd_ps(load_f(a + i + 8), load_f(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(load_f(a + i + 16), load_f(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(load_f(a + i + 24), load_f(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f(a + i), load_f(b + i), acc0);
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    acc0 = _mm256_fmadd_ps(load_part(a + i, rest), load_part(b + i, rest), acc0);
  }
  return reduce_add(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

template <typename X>
void axpy(float alpha, const X* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, load_f(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_part(y + i, _mm256_fmadd_ps(a, load_part(x + i, rest), load_part(y + i, rest)), rest);
  }
}

// out = sum_j w[j] * rows[j], from zero in j order with one multiply-add per term (= axpy
// calls onto a zeroed out); four column vectors per pass over the rows, each out vector
// stored once.
template <typename X>
void weighted_sum(const float* w, const X* const* rows, int64_t count, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t j = 0; j < count; ++j) {
      const __m256 a = _mm256_set1_ps(w[j]);
      const X* x = rows[j] + i;
      acc0 = _mm256_fmadd_ps(a, load_f(x), acc0);
      acc1 = _mm256_fmadd_ps(a, load_f(x + 8), acc1);
      acc2 = _mm256_fmadd_ps(a, load_f(x + 16), acc2);
      acc3 = _mm256_fmadd_ps(a, load_f(x + 24), acc3);
    }
    _mm256_storeu_ps(out + i, acc0);
    _mm256_storeu_ps(out + i + 8, acc1);
    _mm256_storeu_ps(out + i + 16, acc2);
    _mm256_storeu_ps(out + i + 24, acc3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < count; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load_f(rows[j] + i), acc);
    }
    _mm256_storeu_ps(out + i, acc);
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < count; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load_part(rows[j] + i, rest), acc);
    }
    store_part(out + i, acc, rest);
  }
}

// One block of weighted_rows: NR rows x NV vectors of 8 columns, the last vector `last` wide.
template <int NR, int NV, typename X>
void weighted_rows_block(const float* p, int64_t p_stride, const X* v, int64_t v_stride,
                         int64_t tokens, float* o, int64_t o_stride, int last) {
  __m256 acc[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV - 1; ++c) acc[r][c] = _mm256_loadu_ps(o + r * o_stride + 8 * c);
    acc[r][NV - 1] = load_part(o + r * o_stride + 8 * (NV - 1), last);
  }
  for (int64_t j = 0; j < tokens; ++j) {
    __m256 x[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV - 1; ++c) x[c] = load_f(v + j * v_stride + 8 * c);
    x[NV - 1] = last == 8 ? load_f(v + j * v_stride + 8 * (NV - 1))
                          : load_part(v + j * v_stride + 8 * (NV - 1), last);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 a = _mm256_set1_ps(p[r * p_stride + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(a, x[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV - 1; ++c) _mm256_storeu_ps(o + r * o_stride + 8 * c, acc[r][c]);
    store_part(o + r * o_stride + 8 * (NV - 1), acc[r][NV - 1], last);
  }
}

template <int NV, typename X>
void weighted_rows_columns(const float* p, int64_t p_stride, int64_t rows, const X* v,
                           int64_t v_stride, int64_t tokens, float* o, int64_t o_stride, int last) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    weighted_rows_block<4, NV>(p + r * p_stride, p_stride, v, v_stride, tokens, o + r * o_stride,
                               o_stride, last);
  }
  for (; r < rows; ++r) {
    weighted_rows_block<1, NV>(p + r * p_stride, p_stride, v, v_stride, tokens, o + r * o_stride,
                               o_stride, last);
  }
}

// o[r, :] += sum_j p[r, j] v[j, :], each element in j order with one fma per term (= axpy calls).
template <typename X>
void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const X* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim) {
  int64_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    weighted_rows_columns<2>(p, p_stride, rows, v + d, v_stride, tokens, o + d, o_stride, 8);
  }
  for (; d < dim; d += 8) {
    weighted_rows_columns<1>(p, p_stride, rows, v + d, v_stride, tokens, o + d, o_stride,
                             static_cast<int>(std::min<int64_t>(8, dim - d)));
  }
}

void scale(float alpha, float* x, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(a, _mm256_loadu_ps(x + i)));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_part(x + i, _mm256_mul_ps(a, load_part(x + i, rest)), rest);
  }
}

// ---- row kernels ----

template <typename W>
void rmsnorm(const float* x, const W* weight, float* out, int64_t dim, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  for (; i + 8 <= dim; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  if (i < dim) {
    const __m256 a = load_part(x + i, static_cast<int>(dim - i));
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  const float sum_sq = reduce_add(_mm256_add_ps(acc0, acc1));
  const __m256 inv_rms = _mm256_set1_ps(1.0f / sqrt_ss(sum_sq / static_cast<float>(dim) + eps));
  for (i = 0; i + 8 <= dim; i += 8) {
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv_rms), load_f(weight + i)));
  }
  if (i < dim) {
    const int rest = static_cast<int>(dim - i);
    store_part(
        out + i,
        _mm256_mul_ps(_mm256_mul_ps(load_part(x + i, rest), inv_rms), load_part(weight + i, rest)),
        rest);
  }
}

__m256 silu_mul_vec(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, silu_mul_vec(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_part(out + i, silu_mul_vec(load_part(gate + i, rest), load_part(up + i, rest)), rest);
  }
}

void exp_offset(const float* x, float offset, float* out, int64_t n) {
  const __m256 m = _mm256_set1_ps(offset);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_part(out + i, exp_ps(_mm256_sub_ps(load_part(x + i, rest), m)), rest);
  }
}

// Two passes, as the AVX-512 level: the largest non-NaN value (maxps returns its second
// operand, the running maximum, when the first is NaN), then the first index holding it.
int64_t argmax(const float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(x + i), vmax);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float max = -__builtin_inff();
  for (float v : lanes) max = v > max ? v : max;
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  const __m256 m = _mm256_set1_ps(max);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), m, _CMP_EQ_OQ));
    if (hit != 0) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; i < n; ++i) {
    if (x[i] == max) return i;
  }
  return 0;  // every value NaN
}

void softmax(float* x, int64_t n) {
  const float neg_inf = -__builtin_inff();
  __m256 vmax = _mm256_set1_ps(neg_inf);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float max = neg_inf;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float v : lanes) max = v > max ? v : max;
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  if (max == neg_inf) {
    // Fully masked: zeros; a row of NaN and -inf (max_ps skipped the NaN) gives NaN, as the
    // scalar reference. A plain loop: no shared inline helper in this ISA's unit.
    bool nan = false;
    for (i = 0; i < n; ++i) nan = nan || x[i] != x[i];
    for (i = 0; i < n; ++i) x[i] = nan ? __builtin_nanf("") : 0.0f;
    return;
  }
  const __m256 m = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(load_part(x + i, rest), m)),
                                   _mm256_castsi256_ps(first_lanes(rest)));
    store_part(x + i, e, rest);
    sum = _mm256_add_ps(sum, e);
  }
  scale(1.0f / reduce_add(sum), x, n);
}

KernelTable make_avx2_table() {
  KernelTable t;
  t.level = IsaLevel::kAvx2;
  t.matmul_packed_bf16 = &avx2_matmul_packed_bf16;
  t.packed_bf16_fast = true;  // ahead of matmul_f32_bf16 at every m (docs/kernels.md)
  t.matmul_int8 = &avx2_matmul_int8;
  t.quantize_row_int8 = &avx2_quantize_row_int8;
  t.int8_activation_offset = 0;
  t.matmul_f32_bf16 = &matmul_f32_bf16;
  t.matmul_f32_f32 = &matmul_f32_f32;
  t.matmul_bf16_bf16 = nullptr;
  t.bf16_to_fp32 = &bf16_to_fp32;
  t.fp32_to_bf16 = &fp32_to_bf16;
  t.round_to_bf16 = &round_to_bf16;
  t.dot_f32 = &dot<float>;
  t.dot_bf16 = &dot<uint16_t>;
  t.axpy_f32 = &axpy<float>;
  t.axpy_bf16 = &axpy<uint16_t>;
  t.weighted_sum_f32 = &weighted_sum<float>;
  t.weighted_sum_bf16 = &weighted_sum<uint16_t>;
  t.weighted_rows_f32 = &weighted_rows<float>;
  t.weighted_rows_bf16 = &weighted_rows<uint16_t>;
  t.scale = &scale;
  t.rmsnorm_f32 = &rmsnorm<float>;
  t.rmsnorm_bf16 = &rmsnorm<uint16_t>;
  t.silu_mul = &silu_mul;
  t.softmax = &softmax;
  t.argmax = &argmax;
  t.exp_offset = &exp_offset;
  return t;
}

}  // namespace

const KernelTable& avx2_kernel_table() {
  static const KernelTable table = make_avx2_table();
  return table;
}

}  // namespace peerserve::kernels::internal
