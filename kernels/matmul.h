// Matrix products with weights in the Hugging Face nn.Linear layout:
//
//   y[i, j] (+)= sum_k x[i, k] * w[j, k]     i < m, j < n
//
// x is fp32 [m, k], w is [n, k] row-major (bf16 or fp32), y is fp32 [m, n]; each with a
// row stride. w may be a zero-copy view into a memory-mapped checkpoint: only its element
// alignment (2 bytes for bf16) is assumed. Accumulation is always fp32.
//
// Batch invariance (REQUIRED by the engine, tested): for a given ISA level, y[i, j] is
// bitwise the same whatever m is, whichever other rows are in x, however the problems of a
// grouped call are arranged and whatever the thread count is. Each output element is
// summed over k in one fixed order; k is never split across threads.
//
// Threads: output columns are split over `pool`'s threads (16-column granules, in proportion
// to cost; a problem with few columns therefore uses few threads); pool == nullptr runs on
// the calling thread only. One call at a time per pool (see base/thread_pool.h). Shapes and
// pointers are programmer contracts (PS_CHECK).
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels {

// How x enters a bf16-weight product.
enum class ActivationPrecision : uint8_t {
  // x stays fp32; w is widened to fp32. Exact products; only the summation order differs
  // from a sequential fp32 loop.
  kFp32,
  // x is rounded to bf16 (round to nearest even, as float_to_bf16) at the GEMM input; the
  // bf16 x bf16 products are exact in fp32 and summed in fp32 (vdpbf16ps where available).
  // What bf16 inference does, and the fast path for prefill. Except at the avx512_bf16
  // level, where vdpbf16ps reads a subnormal bf16 input (|v| < 2^-126) as zero: its
  // products vanish even when they would be normal numbers.
  kBf16,
};

// One product. Strides are in elements; 0 means "dense" (k for x and w, n for y).
template <typename Weight>
struct MatmulArgs {
  const float* x = nullptr;   // [m, k]: row i starts at x + i * x_stride
  int64_t x_stride = 0;       // >= k, or 0 for k
  const Weight* w = nullptr;  // [n, k]: row j starts at w + j * w_stride
  int64_t w_stride = 0;       // >= k, or 0 for k
  float* y = nullptr;         // [m, n]: row i starts at y + i * y_stride; must not overlap x, w
  int64_t y_stride = 0;       // >= n, or 0 for n
  int64_t m = 0;              // rows of x and y; 0 is allowed (nothing happens)
  int64_t n = 0;              // rows of w, columns of y
  int64_t k = 0;              // columns of x and w; 0 gives y = 0 (or y unchanged)
  bool accumulate = false;    // y += x w^T instead of y = x w^T
};

using MatmulBf16Args = MatmulArgs<bf16>;
using MatmulF32Args = MatmulArgs<float>;

// y = x w^T with bf16 weights.
void matmul_bf16(const MatmulBf16Args& args, ActivationPrecision precision, ThreadPool* pool);

// y = x w^T with fp32 weights (small matrices: routers, norms folded into projections).
void matmul_f32(const MatmulF32Args& args, ThreadPool* pool);

// Many independent bf16 products in one call (MoE experts: expert e sees m_e tokens, often
// 1-4). The work of all problems is split together over the threads in proportion to its
// cost, so that a decode step's 8 experts x (gate, up, down) keep every core streaming
// weights. Problems must not write overlapping parts of y. Batch-invariant like
// matmul_bf16: each problem's result is bitwise what matmul_bf16 alone would give.
void grouped_matmul_bf16(std::span<const MatmulBf16Args> problems, ActivationPrecision precision,
                         ThreadPool* pool);

}  // namespace peerserve::kernels
