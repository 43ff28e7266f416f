// A matrix built at run time from fp32 values (rounded to bf16) in the packed layout of
// kernels/bf16_matrix.h, and products over its leading rows and columns: the prefill
// attention's per-head keys and values, and the decode attention's queries (the heads of a
// query packed, each block of cached bf16 keys the activation side, read in place).
//
//   multiply:  y[i * y_stride + j] (+)= sum over p < k_limit of x[i, p] * w[j, p]
//              for i < m, j < n_limit
//
// Why: the plain attention form (prefill) computed its scores and weighted sums as fp32
// multiply-adds. A head's keys [context, qk] and values [context, v] are each reused by every
// query of the chunk, so packing them once per head and layer lets the scores (queries x
// keys) and the sums (probabilities x values) run on the packed bf16 tile kernel, two
// multiply-adds per lane and instruction where vdpbf16ps exists. The limits serve the causal
// mask: a tile of queries scores only the keys it can see (n_limit) and sums only over them
// (k_limit), with no repacking. In decode the scores (every head against every cached
// latent) were dot products over the 576-wide keys, a horizontal reduction per score; here
// one broadcast key pair feeds 16 heads.
//
// Accuracy: that of matmul_packed_bf16 (its exception for subnormal inputs included) — the
// fp32 sum, in p order per output, of exact bf16 x bf16 products:
// |error| <= (k_limit + 2) * 2^-24 * (sum_p |x_p w_p| + |y|) against the exact sum of the
// same products. Rounding w (and x) to bf16 is the ActivationPrecision::kBf16
// rounding every GEMM input gets. Row invariance: y[i, j] depends only on row i of x, column
// j of w and k_limit — not on m, n_limit or the other rows.
//
// Ownership and thread-safety: owns its panels (grown on reset, never shrunk, so a steady
// prefill allocates nothing); one thread fills, then any number may multiply.
#pragma once

#include <cstdint>

#include "base/aligned_buffer.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels {

class Bf16Panels {
 public:
  // Sizes the panels for a rows x cols matrix. Contents are undefined until filled, except
  // that the lanes of the last panel past `rows` are zero. REQUIRES: rows >= 1, cols >= 1.
  void reset(int64_t rows, int64_t cols);

  // w(j, col0 + p) = w[j * stride + p] for j < rows(), p < width. A width that reaches cols()
  // when cols() is odd also zeroes the padding element. REQUIRES: col0 even,
  // col0 + width <= cols(), stride >= width.
  void fill_rows(const float* w, int64_t stride, int64_t col0, int64_t width);

  // The transpose: w(j, p) = w[p * stride + j] for j < rows(), p < cols() (and the padding
  // element zeroed when cols() is odd). REQUIRES: stride >= rows().
  void fill_transposed(const float* w, int64_t stride);

  // x: row i at x + i * x_stride, with x[i, k_limit] == 0 when k_limit is odd (the
  // pair's second element). REQUIRES: 1 <= n_limit <= rows(), 0 <= k_limit <= cols(),
  // x_stride even and >= k_limit rounded up to even, y_stride >= n_limit.
  void multiply(const bf16* x, int64_t x_stride, int64_t m, int64_t n_limit, int64_t k_limit,
                float* y, int64_t y_stride, bool accumulate) const;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

 private:
  uint16_t* panels() { return reinterpret_cast<uint16_t*>(storage_.data()); }
  const uint16_t* panels() const { return reinterpret_cast<const uint16_t*>(storage_.data()); }

  AlignedBuffer storage_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t panel_stride_ = 0;  // bf16 elements
};

}  // namespace peerserve::kernels
