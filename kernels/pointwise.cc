// Entry points of the row and vector kernels: argument checks, then the active ISA's table.
#include <cstring>

#include "base/check.h"
#include "kernels/activation.h"
#include "kernels/bf16_convert.h"
#include "kernels/internal/kernel_table.h"
#include "kernels/rmsnorm.h"
#include "kernels/softmax.h"
#include "kernels/vector_ops.h"

namespace peerserve::kernels {
namespace {

static_assert(sizeof(bf16) == sizeof(uint16_t) && alignof(bf16) == alignof(uint16_t));

const uint16_t* bits(const bf16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

template <typename W, typename RowFn>
void rmsnorm_rows(const RmsNormArgs& a, const W* weight, RowFn row_fn) {
  PS_CHECK(a.rows >= 0 && a.dim >= 0) << "rmsnorm: rows " << a.rows << ", dim " << a.dim;
  if (a.rows == 0 || a.dim == 0) return;
  const int64_t x_stride = a.x_stride == 0 ? a.dim : a.x_stride;
  const int64_t out_stride = a.out_stride == 0 ? a.dim : a.out_stride;
  PS_CHECK(a.x != nullptr && a.out != nullptr && weight != nullptr);
  PS_CHECK(x_stride >= a.dim && out_stride >= a.dim)
      << "rmsnorm: strides " << x_stride << ", " << out_stride << " < dim " << a.dim;
  for (int64_t r = 0; r < a.rows; ++r) {
    row_fn(a.x + r * x_stride, weight, a.out + r * out_stride, a.dim, a.eps);
  }
}

}  // namespace

void rmsnorm(const RmsNormArgs& args, const float* weight) {
  rmsnorm_rows(args, weight, internal::active_kernel_table().rmsnorm_f32);
}

void rmsnorm(const RmsNormArgs& args, const bf16* weight) {
  rmsnorm_rows(args, bits(weight), internal::active_kernel_table().rmsnorm_bf16);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().silu_mul(gate, up, out, n);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().softmax(x, n);
}

float dot(const float* a, const float* b, int64_t n) {
  if (n <= 0) return 0.0f;
  return internal::active_kernel_table().dot_f32(a, b, n);
}

float dot(const float* a, const bf16* b, int64_t n) {
  if (n <= 0) return 0.0f;
  return internal::active_kernel_table().dot_bf16(a, bits(b), n);
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().axpy_f32(alpha, x, y, n);
}

void axpy(float alpha, const bf16* x, float* y, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().axpy_bf16(alpha, bits(x), y, n);
}

void weighted_sum(const float* w, const float* const* rows, int64_t count, float* out, int64_t n) {
  if (n <= 0) return;
  PS_CHECK(count >= 0) << "weighted_sum: " << count << " rows";
  internal::active_kernel_table().weighted_sum_f32(w, rows, count, out, n);
}

void weighted_sum(const float* w, const bf16* const* rows, int64_t count, float* out, int64_t n) {
  if (n <= 0) return;
  PS_CHECK(count >= 0) << "weighted_sum: " << count << " rows";
  internal::active_kernel_table().weighted_sum_bf16(
      w, reinterpret_cast<const uint16_t* const*>(rows), count, out, n);
}

void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const float* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim) {
  if (rows <= 0 || tokens <= 0 || dim <= 0) return;
  PS_CHECK(p_stride >= tokens || rows == 1);
  PS_CHECK(o_stride >= dim || rows == 1);
  internal::active_kernel_table().weighted_rows_f32(p, p_stride, rows, v, v_stride, tokens, o,
                                                    o_stride, dim);
}

void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const bf16* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim) {
  if (rows <= 0 || tokens <= 0 || dim <= 0) return;
  PS_CHECK(p_stride >= tokens || rows == 1);
  PS_CHECK(o_stride >= dim || rows == 1);
  internal::active_kernel_table().weighted_rows_bf16(p, p_stride, rows, bits(v), v_stride, tokens,
                                                     o, o_stride, dim);
}

void scale(float alpha, float* x, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().scale(alpha, x, n);
}

void exp_offset(const float* x, float offset, float* out, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().exp_offset(x, offset, out, n);
}

int64_t argmax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  return internal::active_kernel_table().argmax(x, n);
}

void bf16_to_fp32(const bf16* src, float* dst, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().bf16_to_fp32(bits(src), dst, n);
}

void fp32_to_bf16(const float* src, bf16* dst, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().fp32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
}

void round_to_bf16(const float* src, float* dst, int64_t n) {
  if (n <= 0) return;
  internal::active_kernel_table().round_to_bf16(src, dst, n);
}

}  // namespace peerserve::kernels
