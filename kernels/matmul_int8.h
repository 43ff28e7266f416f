// W8A8 matrix products over weights packed by kernels/int8_matrix.h:
//
//   y[i, j] (+)= sx[i] * sw[j] * sum_k xq[i, k] * q[j, k]     i < m, j < n
//
// x is fp32 [m, k] with a row stride. Inside the call each row of x is quantized
// dynamically, symmetric per token: sx[i] = absmax_i / 127, xq[i, k] =
// round_to_nearest_even(x[i, k] * 127 / absmax_i) in [-127, 127]. The int8 x int8 products
// are summed exactly in int32 (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw/vpmaddwd, or the scalar
// reference), then a fused epilogue computes float(acc) * (sx[i] * sw[j]) (and adds y).
//
// Batch invariance (REQUIRED by the engine, tested): y[i, j] is bitwise the same whatever m
// is, whichever other rows are in x, however problems are grouped, whatever the thread
// count, and (unlike the bf16 products) at every ISA level: the integer sums are exact and
// the quantization and epilogue are the same fp32 operations everywhere. The gate/up product
// applies the level's silu_mul (kernels/activation.h), so it is bitwise equal to the unfused
// products followed by silu_mul at the same level.
//
// Accuracy: |y - x w^T| <= sum_k (|x_k - x^_k| |w^_jk| + |x_k| |w_jk - w^_jk|) + fp32 rounding,
// with |x_k - x^_k| <= sx / 2 and |w_jk - w^_jk| <= sw_j / 2 (x^, w^ dequantized).
// A row of x holding inf or NaN gives NaN in that row of y (its activation scale is NaN), as
// a float product would, never finite values.
//
// Speed: one loop nest serves decode and prefill. With m <= 6 (AVX-512 VNNI; 2 on AVX2)
// every row sits in the register block and each weight byte is read once (a GEMV, bound by
// memory bandwidth); with more rows the panel group just streamed is reused from L1/L2 by
// each further 6-row step (a GEMM, bound by vpdpbusd). docs/kernels.md has the numbers.
//
// Threads: output columns are split over `pool`'s threads in 16-column panels (32 for
// gate/up), in proportion to cost; k is never split; pool == nullptr runs on the calling
// thread. One call at a time per pool. Shapes and pointers are programmer contracts
// (PS_CHECK); the packed matrix's own invariants were checked when it was built.
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "kernels/int8_matrix.h"

namespace peerserve::kernels {

// y [m, n] (+)= x [m, k] w^T with w a plain-layout PackedInt8Matrix [n, k].
struct MatmulInt8Args {
  const float* x = nullptr;             // [m, k]: row i at x + i * x_stride
  int64_t x_stride = 0;                 // >= k, or 0 for k
  const PackedInt8Matrix* w = nullptr;  // plain layout, rows() = n, cols() = k
  float* y = nullptr;                   // [m, n]: row i at y + i * y_stride; no overlap with x
  int64_t y_stride = 0;                 // >= n, or 0 for n
  int64_t m = 0;                        // 0 is allowed (nothing happens)
  bool accumulate = false;              // y += instead of y =
};

// out [m, i] = silu(x gate^T) * (x up^T) with w a gate/up-layout PackedInt8Matrix
// (rows() = 2 i): the first half of a gated MLP in one pass over x.
struct GateUpInt8Args {
  const float* x = nullptr;
  int64_t x_stride = 0;                       // >= k, or 0 for k
  const PackedInt8Matrix* gate_up = nullptr;  // gate/up layout
  float* out = nullptr;                       // [m, i]; no overlap with x
  int64_t out_stride = 0;                     // >= i, or 0 for i
  int64_t m = 0;
};

void matmul_int8(const MatmulInt8Args& args, ThreadPool* pool);

// Many independent products in one call (MoE experts: expert e sees m_e tokens); the work
// of all problems is split together over the threads. Problems must not write overlapping
// parts of y. Each problem's result is bitwise what matmul_int8 alone gives.
void grouped_matmul_int8(std::span<const MatmulInt8Args> problems, ThreadPool* pool);

void gate_up_silu_int8(const GateUpInt8Args& args, ThreadPool* pool);
void grouped_gate_up_silu_int8(std::span<const GateUpInt8Args> problems, ThreadPool* pool);

}  // namespace peerserve::kernels
