// The per-ISA implementations behind the public kernel entry points.
//
// Each ISA level provides one KernelTable. The public functions (matmul.cc, pointwise.cc)
// pick the table of active_isa_level() and handle threading, scratch buffers and argument
// checks; table functions are single-threaded and assume valid arguments.
//
// The x86 tables live in translation units compiled with that ISA's flags. Those files
// must not call inline functions from other headers (the linker could keep their
// wide-ISA copy for everyone), so they take raw uint16_t bf16 bits and use only local code.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/cpu_features.h"

namespace peerserve::kernels::internal {

// One block of a product: y[i, j] (+)= sum_k x[i, k] * w[j, k] for i < m, n_begin <= j < n_end.
// Element types depend on the entry (see KernelTable).
struct MatmulTile {
  const void* x = nullptr;
  int64_t x_stride = 0;  // elements
  const void* w = nullptr;
  int64_t w_stride = 0;  // elements
  float* y = nullptr;
  int64_t y_stride = 0;  // elements
  int64_t m = 0;
  int64_t k = 0;
  int64_t n_begin = 0;
  int64_t n_end = 0;
  bool accumulate = false;
};

using MatmulTileFn = void (*)(const MatmulTile& tile);

// What an int8 tile does with its int32 sums (kernels/matmul_int8.h).
enum class Int8Epilogue : uint8_t {
  // y[i, c] (+)= float(acc) * (x_scale[i] * w_scale[c]): fp32 y, plain layout.
  kScale,
  // out[i, 16 t + l] = silu_mul(gate, up) of the two scaled sums of panels 2 t (gate) and
  // 2 t + 1 (up), through `silu_mul` (the table's, so fused == unfused bit for bit).
  kGateUpSilu,
  // y[i, c] = acc as int32 (tests: exact integer sums).
  kInt32,
};

// Columns [16 * panel_begin, 16 * panel_end) of an int8 product over the packed layout of
// kernels/int8_matrix.h (panel_begin, panel_end even for kGateUpSilu). acc[i, c] is the exact
// integer sum_p xq[i, p] * q[c, p]; x arrives quantized by the table's quantize_row_int8
// (plus the table's activation offset), rows padded to 4 * k_groups bytes.
struct Int8Tile {
  const uint8_t* x = nullptr;      // [m, x_stride] quantized activations
  int64_t x_stride = 0;            // bytes, >= 4 * k_groups
  const float* x_scale = nullptr;  // [m]
  int64_t m = 0;
  const int8_t* w = nullptr;  // packed panels (64-byte aligned)
  int64_t panel_stride = 0;   // bytes
  int64_t k_groups = 0;
  const float* w_scale = nullptr;         // per packed column
  const int32_t* w_correction = nullptr;  // per packed column: 128 * sum_p q[c, p]
  int64_t panel_begin = 0;
  int64_t panel_end = 0;
  void* y = nullptr;        // float (or int32 for kInt32)
  int64_t y_stride = 0;     // elements
  int64_t n = 0;            // valid output columns of y (columns at or past n are not written)
  bool accumulate = false;  // kScale only
  Int8Epilogue epilogue = Int8Epilogue::kScale;
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
};

using Int8TileFn = void (*)(const Int8Tile& tile);

// Columns [16 * panel_begin, 16 * panel_end) of a bf16 product over the packed layout of
// kernels/bf16_matrix.h (kernels/matmul_packed_bf16.h). x arrives as bf16 bits, each row
// zero-padded to 2 * k_pairs elements.
struct PackedBf16Tile {
  const uint16_t* x = nullptr;  // [m, x_stride] bf16 bits
  int64_t x_stride = 0;         // elements, >= 2 * k_pairs
  int64_t m = 0;
  const uint16_t* w = nullptr;  // packed panels (64-byte aligned)
  int64_t panel_stride = 0;     // elements
  int64_t k_pairs = 0;
  int64_t panel_begin = 0;
  int64_t panel_end = 0;
  float* y = nullptr;
  int64_t y_stride = 0;  // elements
  int64_t n = 0;         // valid output columns (columns at or past n are not written)
  bool accumulate = false;
};

using PackedBf16TileFn = void (*)(const PackedBf16Tile& tile);

struct KernelTable {
  IsaLevel level = IsaLevel::kScalar;

  // x fp32, w bf16 bits, fp32 multiply-add.
  MatmulTileFn matmul_f32_bf16 = nullptr;
  // x fp32, w fp32.
  MatmulTileFn matmul_f32_f32 = nullptr;
  // x bf16 bits with k padded by zeros to a multiple of bf16_x_k_multiple (x_stride is the
  // padded length), w bf16 bits. nullptr where the ISA has no bf16 dot product: callers
  // then round x to bf16 values and use matmul_f32_bf16 (the same products, exactly).
  MatmulTileFn matmul_bf16_bf16 = nullptr;
  int64_t bf16_x_k_multiple = 1;

  // bf16 product over a packed bf16 matrix; `packed_bf16_fast` where it beats
  // matmul_bf16_bf16 / matmul_f32_bf16 on the checkpoint layout (the model packs only then).
  PackedBf16TileFn matmul_packed_bf16 = nullptr;
  bool packed_bf16_fast = false;

  // W8A8 product over a packed int8 matrix; activations quantized by quantize_row_int8.
  Int8TileFn matmul_int8 = nullptr;
  // One row of x -> k_padded bytes: round_to_nearest_even(x * 127 / absmax) clamped to
  // [-127, 127], plus `offset` (mod 256), then `offset` up to k_padded; returns the scale
  // absmax / 127 (0 for an all-zero row). A row holding inf or NaN gives
  // non_finite_row_int8's bytes and NaN scale. Bit for bit the same at every level.
  float (*quantize_row_int8)(const float* x, int64_t k, int64_t k_padded, uint8_t offset,
                             uint8_t* out) = nullptr;
  // Added to every quantized activation: 128 where the kernel multiplies unsigned x bytes
  // (vpdpbusd) and subtracts w_correction; 0 where it takes signed x.
  uint8_t int8_activation_offset = 0;

  void (*bf16_to_fp32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*fp32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  void (*round_to_bf16)(const float* src, float* dst, int64_t n) = nullptr;

  float (*dot_f32)(const float* a, const float* b, int64_t n) = nullptr;
  float (*dot_bf16)(const float* a, const uint16_t* b, int64_t n) = nullptr;
  void (*axpy_f32)(float alpha, const float* x, float* y, int64_t n) = nullptr;
  void (*axpy_bf16)(float alpha, const uint16_t* x, float* y, int64_t n) = nullptr;
  void (*scale)(float alpha, float* x, int64_t n) = nullptr;
  // out[d] = sum_{j < count} w[j] * rows[j][d] for d < n, from zero in j order with one
  // multiply-add per term: bit for bit zeroing out, then axpy(w[j], rows[j], out) in order.
  void (*weighted_sum_f32)(const float* w, const float* const* rows, int64_t count, float* out,
                           int64_t n) = nullptr;
  void (*weighted_sum_bf16)(const float* w, const uint16_t* const* rows, int64_t count, float* out,
                            int64_t n) = nullptr;

  // o[r * o_stride + d] += sum_{j < tokens} p[r * p_stride + j] * v[j * v_stride + d] for
  // r < rows, d < dim; each element summed in j order, one multiply-add per term, so the
  // result is bit for bit that of axpy calls in j order.
  void (*weighted_rows_f32)(const float* p, int64_t p_stride, int64_t rows, const float* v,
                            int64_t v_stride, int64_t tokens, float* o, int64_t o_stride,
                            int64_t dim) = nullptr;
  void (*weighted_rows_bf16)(const float* p, int64_t p_stride, int64_t rows, const uint16_t* v,
                             int64_t v_stride, int64_t tokens, float* o, int64_t o_stride,
                             int64_t dim) = nullptr;

  // One row: out = x * inv_rms * weight.
  void (*rmsnorm_f32)(const float* x, const float* weight, float* out, int64_t dim,
                      float eps) = nullptr;
  void (*rmsnorm_bf16)(const float* x, const uint16_t* weight, float* out, int64_t dim,
                       float eps) = nullptr;
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  void (*softmax)(float* x, int64_t n) = nullptr;
  int64_t (*argmax)(const float* x, int64_t n) = nullptr;
  void (*exp_offset)(const float* x, float offset, float* out, int64_t n) = nullptr;
};

const KernelTable& scalar_kernel_table();
const KernelTable& avx2_kernel_table();         // REQUIRES: isa_level_supported(kAvx2)
const KernelTable& avx512_kernel_table();       // REQUIRES: isa_level_supported(kAvx512)
const KernelTable& avx512_vnni_kernel_table();  // REQUIRES: isa_level_supported(kAvx512Vnni)
const KernelTable& avx512_bf16_kernel_table();  // REQUIRES: isa_level_supported(kAvx512Bf16)

// The int8 entries per ISA, defined in their own translation units (compiled with that
// ISA's flags) and reached only through the tables.
void scalar_matmul_int8(const Int8Tile& tile);
float scalar_quantize_row_int8(const float* x, int64_t k, int64_t k_padded, uint8_t offset,
                               uint8_t* out);
void avx2_matmul_int8(const Int8Tile& tile);
float avx2_quantize_row_int8(const float* x, int64_t k, int64_t k_padded, uint8_t offset,
                             uint8_t* out);

void scalar_matmul_packed_bf16(const PackedBf16Tile& tile);
void avx2_matmul_packed_bf16(const PackedBf16Tile& tile);

// quantize_row_int8 of a row holding inf or NaN: every byte `offset` (zero) and a NaN scale,
// so that the product's row is NaN, as a float product's would be (rounding the row to
// finite bytes gave plausible values from a damaged input).
inline float non_finite_row_int8(int64_t k_padded, uint8_t offset, uint8_t* out) {
  for (int64_t p = 0; p < k_padded; ++p) out[p] = offset;
  return std::numeric_limits<float>::quiet_NaN();
}

// The table of active_isa_level().
const KernelTable& active_kernel_table();

}  // namespace peerserve::kernels::internal
