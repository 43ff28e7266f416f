// BF16 weights repacked once (at model load) for the outer-product kernels of
// kernels/matmul_packed_bf16.h.
//
// The checkpoint's nn.Linear layout [n, k] suits a dot-product kernel (one output per
// accumulator, a horizontal reduction per output). This layout suits the broadcast form that
// vdpbf16ps is built for: output columns are grouped in panels of 16 and k in pairs (the two
// bf16 one vdpbf16ps lane multiplies), so that one aligned 64-byte load holds 2 consecutive k
// of 16 columns:
//
//   element of (column c, k index p) = panel_stride * (c / 16) + 32 * (p / 2) + 2 * (c % 16) + p %
//   2
//
// (in bf16 elements). k is zero-padded to a multiple of 2 and the columns to a multiple of 16.
// The panel stride is k_pairs * 32 elements, plus one cache line when that is a multiple of
// 4 KiB (the panels a microkernel reads together would otherwise share L1 sets).
//
// Ownership and thread-safety: owns its storage (64-byte aligned); movable, not copyable;
// immutable after construction, so any number of threads may read it concurrently.
#pragma once

#include <cstdint>

#include "base/aligned_buffer.h"
#include "base/status.h"
#include "kernels/int8_matrix.h"  // MatrixView
#include "tensor/float_convert.h"

namespace peerserve::kernels {

class PackedBf16Matrix {
 public:
  static constexpr int64_t kPanelColumns = 16;
  static constexpr int64_t kGroupK = 2;

  // The panel stride (bf16 elements) of a matrix with `cols` columns (k): k_pairs * 32, plus
  // one cache line when that is a multiple of 4 KiB. Shared with other packers of this layout
  // (kernels/bf16_panels.h).
  static int64_t panel_stride_for(int64_t cols);

  // Packs w [n, k] (values copied bit for bit). InvalidArgument for negative sizes, a stride
  // below cols, or null data with a non-empty shape.
  static Result<PackedBf16Matrix> pack(MatrixView<bf16> w);

  PackedBf16Matrix(PackedBf16Matrix&&) noexcept = default;
  PackedBf16Matrix& operator=(PackedBf16Matrix&&) noexcept = default;
  PackedBf16Matrix(const PackedBf16Matrix&) = delete;
  PackedBf16Matrix& operator=(const PackedBf16Matrix&) = delete;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // w[row, col] as packed. REQUIRES: 0 <= row < rows(), 0 <= col < cols().
  bf16 value(int64_t row, int64_t col) const;
  // Bytes held.
  int64_t bytes() const { return panels_ * panel_stride_ * 2; }

  // ---- for the kernels (kernels/internal) ----
  int64_t panels() const { return panels_; }
  int64_t k_pairs() const { return k_pairs_; }
  int64_t panel_stride() const { return panel_stride_; }  // bf16 elements
  const uint16_t* panel_data() const { return reinterpret_cast<const uint16_t*>(storage_.data()); }

 private:
  PackedBf16Matrix(int64_t rows, int64_t cols);

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t panels_ = 0;
  int64_t k_pairs_ = 0;
  int64_t panel_stride_ = 0;
  AlignedBuffer storage_;  // the panels, zero-padded
};

}  // namespace peerserve::kernels
