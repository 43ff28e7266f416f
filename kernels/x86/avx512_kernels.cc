// AVX-512 (F/BW/VL/DQ) kernels: 16-lane fp32 multiply-add. Compiled with -mavx512*; see
// internal/kernel_table.h for why nothing here calls inline code from other headers.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/avx512_math.h"
#include "kernels/x86/fma_matmul.h"

namespace peerserve::kernels::internal {
namespace {

__mmask16 first_lanes(int count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

struct Avx512Ops {
  using Reg = __m512;
  static constexpr int64_t kLanes = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load_x(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_x_part(const float* p, int count) {
    return _mm512_maskz_loadu_ps(first_lanes(count), p);
  }
  static Reg load_w(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_w_part(const float* p, int count) { return load_x_part(p, count); }
  static Reg load_w(const uint16_t* p) {
    return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Reg load_w_part(const uint16_t* p, int count) {
    return widen_bf16(_mm256_maskz_loadu_epi16(first_lanes(count), p));
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  template <int MR, int NR>
  static void store_sums(const Reg (&acc)[MR][NR], float* y, int64_t y_stride, bool accumulate) {
    store_block_sums<MR, NR>(acc, y, y_stride, accumulate);
  }
};

// ---- matmul ----

void matmul_f32_bf16(const MatmulTile& t) {
  if (t.m == 1) {
    fma_tile<Avx512Ops, 1, 8, float, uint16_t>(t);
  } else {
    fma_tile<Avx512Ops, 4, 6, float, uint16_t>(t);
  }
}

void matmul_f32_f32(const MatmulTile& t) {
  if (t.m == 1) {
    fma_tile<Avx512Ops, 1, 8, float, float>(t);
  } else {
    fma_tile<Avx512Ops, 4, 6, float, float>(t);
  }
}

// ---- conversions ----

void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i,
                     widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(dst + i, mask, widen_bf16(_mm256_maskz_loadu_epi16(mask, src + i)));
  }
}

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = round_bf16_bits(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    const __m512i bits = round_bf16_bits(_mm512_maskz_loadu_epi32(mask, src + i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, mask, _mm512_srli_epi32(bits, 16));
  }
}

void round_to_bf16(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_si512(dst + i, round_bf16_bits(_mm512_loadu_si512(src + i)));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_epi32(dst + i, mask,
                             round_bf16_bits(_mm512_maskz_loadu_epi32(mask, src + i)));
  }
}

// ---- vector ops ----

__m512 load_f(const float* p) {
  return _mm512_loadu_ps(p);
}
__m512 load_f(const uint16_t* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__m512 load_f_part(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
__m512 load_f_part(const uint16_t* p, __mmask16 mask) {
  return widen_bf16(_mm256_maskz_loadu_epi16(mask, p));
}

// Four accumulators (latency), combined in a fixed order.
template <typename B>
float dot(const float* a, const B* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(load_f(a + i), load_f(b + i), acc0);
    acc1 = _mm512_fmadd_ps(load_f(a + i + 16), load_f(b + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(load_f(a + i + 32), load_f(b + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(load_f(a + i + 48), load_f(b + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load_f(a + i), load_f(b + i), acc0);
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    acc0 = _mm512_fmadd_ps(load_f_part(a + i, mask), load_f_part(b + i, mask), acc0);
  }
  return reduce_add(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

template <typename X>
void axpy(float alpha, const X* x, float* y, int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, load_f(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(
        y + i, mask,
        _mm512_fmadd_ps(a, load_f_part(x + i, mask), _mm512_maskz_loadu_ps(mask, y + i)));
  }
}

// out = sum_j w[j] * rows[j], from zero in j order with one multiply-add per term (= axpy
// calls onto a zeroed out); four column vectors per pass over the rows, each out vector
// stored once.
template <typename X>
void weighted_sum(const float* w, const X* const* rows, int64_t count, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t j = 0; j < count; ++j) {
      const __m512 a = _mm512_set1_ps(w[j]);
      const X* x = rows[j] + i;
      acc0 = _mm512_fmadd_ps(a, load_f(x), acc0);
      acc1 = _mm512_fmadd_ps(a, load_f(x + 16), acc1);
      acc2 = _mm512_fmadd_ps(a, load_f(x + 32), acc2);
      acc3 = _mm512_fmadd_ps(a, load_f(x + 48), acc3);
    }
    _mm512_storeu_ps(out + i, acc0);
    _mm512_storeu_ps(out + i + 16, acc1);
    _mm512_storeu_ps(out + i + 32, acc2);
    _mm512_storeu_ps(out + i + 48, acc3);
  }
  for (; i < n; i += 16) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i < 16 ? n - i : 16));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < count; ++j) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), load_f_part(rows[j] + i, mask), acc);
    }
    _mm512_mask_storeu_ps(out + i, mask, acc);
  }
}

// One block of weighted_rows: NR rows x NV vectors of 16 columns, the last vector masked.
template <int NR, int NV, typename X>
void weighted_rows_block(const float* p, int64_t p_stride, const X* v, int64_t v_stride,
                         int64_t tokens, float* o, int64_t o_stride, __mmask16 last) {
  __m512 acc[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      acc[r][c] =
          _mm512_maskz_loadu_ps(c == NV - 1 ? last : __mmask16{0xFFFF}, o + r * o_stride + 16 * c);
    }
  }
  for (int64_t j = 0; j < tokens; ++j) {
    __m512 x[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      x[c] = c == NV - 1 ? load_f_part(v + j * v_stride + 16 * c, last)
                         : load_f(v + j * v_stride + 16 * c);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 a = _mm512_set1_ps(p[r * p_stride + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(a, x[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      _mm512_mask_storeu_ps(o + r * o_stride + 16 * c, c == NV - 1 ? last : __mmask16{0xFFFF},
                            acc[r][c]);
    }
  }
}

template <int NV, typename X>
void weighted_rows_columns(const float* p, int64_t p_stride, int64_t rows, const X* v,
                           int64_t v_stride, int64_t tokens, float* o, int64_t o_stride,
                           __mmask16 last) {
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
  for (; d + 64 <= dim; d += 64) {
    weighted_rows_columns<4>(p, p_stride, rows, v + d, v_stride, tokens, o + d, o_stride,
                             __mmask16{0xFFFF});
  }
  for (; d < dim; d += 16) {
    const __mmask16 last = first_lanes(static_cast<int>(std::min<int64_t>(16, dim - d)));
    weighted_rows_columns<1>(p, p_stride, rows, v + d, v_stride, tokens, o + d, o_stride, last);
  }
}

void scale(float alpha, float* x, int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(a, _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(x + i, mask, _mm512_mul_ps(a, _mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// ---- row kernels ----

template <typename W>
void rmsnorm(const float* x, const W* weight, float* out, int64_t dim, float eps) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i + 16 <= dim; i += 16) {
    const __m512 a = _mm512_loadu_ps(x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  if (i < dim) {
    const __m512 a = _mm512_maskz_loadu_ps(first_lanes(static_cast<int>(dim - i)), x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float sum_sq = reduce_add(_mm512_add_ps(acc0, acc1));
  const __m512 inv_rms = _mm512_set1_ps(1.0f / sqrt_ss(sum_sq / static_cast<float>(dim) + eps));
  for (i = 0; i + 16 <= dim; i += 16) {
    _mm512_storeu_ps(
        out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv_rms), load_f(weight + i)));
  }
  if (i < dim) {
    const __mmask16 mask = first_lanes(static_cast<int>(dim - i));
    _mm512_mask_storeu_ps(out + i, mask,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inv_rms),
                                        load_f_part(weight + i, mask)));
  }
}

__m512 silu_mul_vec(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, silu_mul_vec(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(
        out + i, mask,
        silu_mul_vec(_mm512_maskz_loadu_ps(mask, gate + i), _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

void exp_offset(const float* x, float offset, float* out, int64_t n) {
  const __m512 m = _mm512_set1_ps(offset);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(out + i, mask,
                          exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), m)));
  }
}

// Two passes: the largest non-NaN value (max_ps returns its second operand, the running
// maximum, when the first is NaN), then the first index holding it (NaN never compares equal;
// -0 == +0, so the first zero when the maximum is a zero, as the scalar loop's strict > keeps).
int64_t argmax(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 vmax = neg_inf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(_mm512_loadu_ps(x + i), vmax);
  if (i < n) {
    vmax = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, first_lanes(static_cast<int>(n - i)), x + i),
                         vmax);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), m, _CMP_EQ_OQ);
    if (hit != 0) return i + __builtin_ctz(hit);
  }
  if (i < n) {
    const __mmask16 lanes = first_lanes(static_cast<int>(n - i));
    const __mmask16 hit =
        _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, x + i), m, _CMP_EQ_OQ);
    if (hit != 0) return i + __builtin_ctz(hit);
  }
  return 0;  // every value NaN
}

void softmax(float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 vmax = neg_inf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
  if (i < n) {
    vmax = _mm512_max_ps(
        vmax, _mm512_mask_loadu_ps(neg_inf, first_lanes(static_cast<int>(n - i)), x + i));
  }
  const float max = _mm512_reduce_max_ps(vmax);
  if (max == -__builtin_inff()) {
    // Fully masked: zeros; a row of NaN and -inf (max_ps skipped the NaN) gives NaN, as the
    // scalar reference. A plain loop: no shared inline helper in this ISA's unit.
    bool nan = false;
    for (i = 0; i < n; ++i) nan = nan || x[i] != x[i];
    for (i = 0; i < n; ++i) x[i] = nan ? __builtin_nanf("") : 0.0f;
    return;
  }
  const __m512 m = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    const __m512 e =
        _mm512_maskz_mov_ps(mask, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), m)));
    _mm512_mask_storeu_ps(x + i, mask, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv_sum = _mm512_set1_ps(1.0f / reduce_add(sum));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv_sum));
  if (i < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(x + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inv_sum));
  }
}

KernelTable make_avx512_table() {
  KernelTable t;
  t.level = IsaLevel::kAvx512;
  // The AVX2 packed kernel: correct here, but behind the 16-lane FMA kernels on the
  // checkpoint layout from m = 4 up (docs/kernels.md), so the model does not pack.
  t.matmul_packed_bf16 = &avx2_matmul_packed_bf16;
  // No VNNI: the AVX2 int8 kernels (AVX-512 without VNNI is only Skylake-SP/X).
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

const KernelTable& avx512_kernel_table() {
  static const KernelTable table = make_avx512_table();
  return table;
}

}  // namespace peerserve::kernels::internal
