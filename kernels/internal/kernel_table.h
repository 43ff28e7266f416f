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

  void (*bf16_to_fp32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*fp32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  void (*round_to_bf16)(const float* src, float* dst, int64_t n) = nullptr;

  float (*dot_f32)(const float* a, const float* b, int64_t n) = nullptr;
  float (*dot_bf16)(const float* a, const uint16_t* b, int64_t n) = nullptr;
  void (*axpy_f32)(float alpha, const float* x, float* y, int64_t n) = nullptr;
  void (*axpy_bf16)(float alpha, const uint16_t* x, float* y, int64_t n) = nullptr;
  void (*scale)(float alpha, float* x, int64_t n) = nullptr;

  // One row: out = x * inv_rms * weight.
  void (*rmsnorm_f32)(const float* x, const float* weight, float* out, int64_t dim,
                      float eps) = nullptr;
  void (*rmsnorm_bf16)(const float* x, const uint16_t* weight, float* out, int64_t dim,
                       float eps) = nullptr;
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  void (*softmax)(float* x, int64_t n) = nullptr;
};

const KernelTable& scalar_kernel_table();
const KernelTable& avx2_kernel_table();         // REQUIRES: isa_level_supported(kAvx2)
const KernelTable& avx512_kernel_table();       // REQUIRES: isa_level_supported(kAvx512)
const KernelTable& avx512_bf16_kernel_table();  // REQUIRES: isa_level_supported(kAvx512Bf16)

// The table of active_isa_level().
const KernelTable& active_kernel_table();

}  // namespace peerserve::kernels::internal
