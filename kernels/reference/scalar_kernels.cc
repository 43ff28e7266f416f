// The scalar reference: plain loops, one fp32 accumulator summed in index order. Obviously
// correct, batch-invariant by construction, and the kScalar level of every kernel.
#include <cmath>
#include <limits>

#include "kernels/internal/kernel_table.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels::internal {
namespace {

float widen(float v) {
  return v;
}
float widen(uint16_t bits) {
  return bf16_to_float(bf16{bits});
}

template <typename X, typename W>
void matmul_tile(const MatmulTile& t) {
  const X* x = static_cast<const X*>(t.x);
  const W* w = static_cast<const W*>(t.w);
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = t.n_begin; j < t.n_end; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < t.k; ++p) {
        acc += widen(x[i * t.x_stride + p]) * widen(w[j * t.w_stride + p]);
      }
      float& out = t.y[i * t.y_stride + j];
      out = t.accumulate ? out + acc : acc;
    }
  }
}

void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(bf16{src[i]});
}

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]).bits;
}

void round_to_bf16(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(float_to_bf16(src[i]));
}

template <typename B>
float dot(const float* a, const B* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * widen(b[i]);
  return acc;
}

template <typename X>
void axpy(float alpha, const X* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * widen(x[i]);
}

template <typename X>
void weighted_sum(const float* w, const X* const* rows, int64_t count, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < count; ++j) axpy(w[j], rows[j], out, n);
}

template <typename X>
void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const X* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim) {
  for (int64_t j = 0; j < tokens; ++j) {
    for (int64_t r = 0; r < rows; ++r)
      axpy(p[r * p_stride + j], v + j * v_stride, o + r * o_stride, dim);
  }
}

void scale(float alpha, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

template <typename W>
void rmsnorm(const float* x, const W* weight, float* out, int64_t dim, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv_rms * widen(weight[i]);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  if (max == -std::numeric_limits<float>::infinity()) {
    // Fully masked: zeros. fmax skipped NaN, so a row of NaN and -inf lands here too: NaN.
    bool nan = false;
    for (int64_t i = 0; i < n; ++i) nan = nan || x[i] != x[i];
    const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    for (int64_t i = 0; i < n; ++i) x[i] = fill;
    return;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv_sum;
}

void exp_offset(const float* x, float offset, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - offset);
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

KernelTable make_scalar_table() {
  KernelTable t;
  t.level = IsaLevel::kScalar;
  t.matmul_int8 = &scalar_matmul_int8;
  t.matmul_packed_bf16 = &scalar_matmul_packed_bf16;
  t.quantize_row_int8 = &scalar_quantize_row_int8;
  t.int8_activation_offset = 0;
  t.matmul_f32_bf16 = &matmul_tile<float, uint16_t>;
  t.matmul_f32_f32 = &matmul_tile<float, float>;
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

const KernelTable& scalar_kernel_table() {
  static const KernelTable table = make_scalar_table();
  return table;
}

}  // namespace peerserve::kernels::internal
