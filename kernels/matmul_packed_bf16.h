// BF16 matrix products over weights repacked by kernels/bf16_matrix.h:
//
//   y[i, j] (+)= sum_k bf16(x[i, k]) * w[j, k]     i < m, j < n
//
// x is fp32 [m, k] with a row stride, rounded to bf16 (round to nearest even) at the input
// as ActivationPrecision::kBf16 of kernels/matmul.h does; the bf16 x bf16 products are exact
// in fp32 (unless below 2^-126, where the FMA levels round them once fewer than the scalar
// one) and summed in fp32. The outer-product form: one vector lane per output column,
// activations broadcast, k summed sequentially in pairs per lane (vdpbf16ps where available;
// elsewhere two fp32 adds per pair, in the same order at every other level). No horizontal
// reductions, and one loop nest for decode and prefill: with few rows every row sits in the
// register block and each weight byte is read once (a GEMV), with many the panel group just
// streamed is reused from cache by each further row step (a GEMM).
//
// Batch invariance (REQUIRED by the engine, tested): for a given ISA level, y[i, j] is
// bitwise the same whatever m is, whichever other rows are in x, however problems are
// grouped and whatever the thread count. Results differ between levels by rounding only.
//
// Accuracy: each output is a chain of k fp32 additions (2 per pair), one more with
// accumulate, so against the exact sum of the same bf16 products (plus y)
// |error| <= (k + 2) * 2^-24 * (sum_k |x_k w_k| + |y|), except that vdpbf16ps (the
// avx512_bf16 level) flushes subnormal products to zero and reads subnormal bf16 inputs
// (|v| < 2^-126) as zero, so the products of such inputs are lost even when normal.
//
// Threads: output columns are split over `pool`'s threads in 16-column panels, in proportion
// to cost; k is never split; pool == nullptr runs on the calling thread. One call at a time
// per pool. Shapes and pointers are programmer contracts (PS_CHECK).
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "kernels/bf16_matrix.h"

namespace peerserve::kernels {

struct MatmulPackedBf16Args {
  const float* x = nullptr;             // [m, k]: row i at x + i * x_stride
  int64_t x_stride = 0;                 // >= k, or 0 for k
  const PackedBf16Matrix* w = nullptr;  // rows() = n, cols() = k
  float* y = nullptr;                   // [m, n]: row i at y + i * y_stride; no overlap with x
  int64_t y_stride = 0;                 // >= n, or 0 for n
  int64_t m = 0;                        // 0 is allowed (nothing happens)
  bool accumulate = false;              // y += instead of y =
};

void matmul_packed_bf16(const MatmulPackedBf16Args& args, ThreadPool* pool);

// Many independent products in one call (MoE experts: expert e sees m_e tokens); the work
// of all problems is split together over the threads. Problems must not write overlapping
// parts of y. Each problem's result is bitwise what matmul_packed_bf16 alone gives.
void grouped_matmul_packed_bf16(std::span<const MatmulPackedBf16Args> problems, ThreadPool* pool);

// Whether the active ISA level has a packed kernel faster than the checkpoint-layout one
// (the model packs its weights at load only then). Every level can run the products.
bool packed_bf16_is_fast();

}  // namespace peerserve::kernels
