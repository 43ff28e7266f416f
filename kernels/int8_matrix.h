// INT8 weights for the W8A8 products of kernels/matmul_int8.h: symmetric quantization per
// output channel, repacked once (at model load) into the layout the kernels read.
//
// A weight w [n, k] in the nn.Linear layout is held as int8 q[j, p] in [-127, 127] and one
// fp32 scale s[j] per row j: w[j, p] ~ q[j, p] * s[j]. Quantizing from floating point uses
// the row's absmax: s[j] = absmax_j / 127 and q[j, p] = round_to_nearest_even(w[j, p] *
// (127 / absmax_j)) (an all-zero row gets s = 0, q = 0). An INT8 checkpoint that already
// holds q and s is packed as is (pack / pack_gate_up). -128 is rejected: the AVX2 kernel's
// no-saturation argument (docs/kernels.md) needs |q| <= 127.
//
// Packed layout (what the kernels read; tests use the accessors): output columns are grouped
// in panels of 16, k in groups of 4 (the 4 bytes one vpdpbusd lane multiplies), so that one
// aligned 64-byte load holds 4 consecutive k of 16 columns:
//
//   byte of (column c, k index p) = panel_stride * (c / 16) + 64 * (p / 4) + 4 * (c % 16) + p % 4
//
// k is zero-padded to a multiple of 4 and the columns to a multiple of 16. The panel stride
// is k_groups * 64 bytes, plus one cache line when that is a multiple of 4 KiB (the panels a
// microkernel reads together would otherwise fall into the same L1 sets). Per packed column
// the matrix also keeps its scale and 128 * sum_p q[c, p] (the correction that lets the
// VNNI kernel feed activations as unsigned bytes, x + 128).
//
// Gate/up layout (a MoE expert's or a dense MLP's gate_proj and up_proj, fused): panels
// alternate gate rows [16 t, 16 t + 16) and up rows [16 t, 16 t + 16), so one pass over x
// yields both halves of silu(x gate^T) * (x up^T) for 16 outputs. rows() is 2 * intermediate:
// logical rows [0, intermediate) are gate, [intermediate, 2 intermediate) are up.
//
// Ownership and thread-safety: owns its storage (64-byte aligned); movable, not copyable;
// immutable after construction, so any number of threads may read it concurrently.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "base/aligned_buffer.h"
#include "base/status.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels {

// A row-major [rows, cols] matrix in memory (e.g. a tensor of a memory-mapped checkpoint).
template <typename T>
struct MatrixView {
  const T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts; 0 means cols
};

// Already-quantized weights: values [rows, cols] int8 (in [-127, 127]) and scales [rows].
struct Int8WeightsView {
  MatrixView<int8_t> values;
  const float* scales = nullptr;
};

// Largest k the kernels accept: |sum_p (x_p + 128) * q_p| <= 255 * 127 * k must fit in
// int32 (the accumulator); 65536 leaves a margin (DeepSeek-V3's largest k is 18432).
inline constexpr int64_t kMaxInt8Cols = 65536;

// Symmetric round-to-nearest quantization of one row, as quantize() does it: writes q (k
// values in [-127, 127]) and returns the scale absmax / 127 (0 for an all-zero row).
// Offline writers of INT8 checkpoints use it so that a stored weight packs to exactly what
// quantizing at load gives. REQUIRES: q.size() == w.size().
float quantize_int8_row(std::span<const float> w, std::span<int8_t> q);
// The same with the range clipped to ratio * absmax (0 < ratio <= 1; values beyond it give
// +-127) and the scale ratio * absmax / 127: the clipping step of the offline pipeline
// (model/int8_calibration.h). Ratio 1 is quantize_int8_row. REQUIRES: finite w.
float quantize_int8_row_clipped(std::span<const float> w, float ratio, std::span<int8_t> q);

class PackedInt8Matrix {
 public:
  // Output columns per panel and k elements per group of the packed layout.
  static constexpr int64_t kPanelColumns = 16;
  static constexpr int64_t kGroupK = 4;

  // Quantizes w [n, k] (round to nearest, per-row absmax) and packs it. InvalidArgument for
  // a null pointer with a non-empty shape, negative sizes, a stride below cols, k above
  // kMaxInt8Cols or a non-finite weight (named by row and column).
  static Result<PackedInt8Matrix> quantize(MatrixView<bf16> w);
  static Result<PackedInt8Matrix> quantize(MatrixView<float> w);
  // Packs int8 weights and their per-row scales. InvalidArgument as above, and for a value
  // of -128 or a negative or non-finite scale.
  static Result<PackedInt8Matrix> pack(const Int8WeightsView& w);

  // The gate/up layout from gate [i, k] and up [i, k] (same shape).
  static Result<PackedInt8Matrix> quantize_gate_up(MatrixView<bf16> gate, MatrixView<bf16> up);
  static Result<PackedInt8Matrix> quantize_gate_up(MatrixView<float> gate, MatrixView<float> up);
  static Result<PackedInt8Matrix> pack_gate_up(const Int8WeightsView& gate,
                                               const Int8WeightsView& up);

  PackedInt8Matrix(PackedInt8Matrix&&) noexcept = default;
  PackedInt8Matrix& operator=(PackedInt8Matrix&&) noexcept = default;
  PackedInt8Matrix(const PackedInt8Matrix&) = delete;
  PackedInt8Matrix& operator=(const PackedInt8Matrix&) = delete;

  // Logical shape [rows, cols] (gate/up: rows = 2 * intermediate, gate rows first).
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool is_gate_up() const { return gate_up_; }
  // Outputs per row of x: rows() for the plain layout, intermediate for gate/up.
  int64_t outputs() const { return gate_up_ ? rows_ / 2 : rows_; }

  // Quantized value, scale and dequantized row (q * s) of logical row `row`.
  // REQUIRES: 0 <= row < rows(), 0 <= col < cols(), out.size() == cols().
  int8_t value(int64_t row, int64_t col) const;
  float scale(int64_t row) const;
  void dequantized_row(int64_t row, std::span<float> out) const;

  // Bytes held (packed values, scales, corrections).
  int64_t bytes() const;

  // ---- for the kernels (kernels/internal) ----
  int64_t panels() const { return panels_; }
  int64_t k_groups() const { return k_groups_; }
  int64_t panel_stride() const { return panel_stride_; }  // bytes
  const int8_t* panel_data() const { return reinterpret_cast<const int8_t*>(storage_.data()); }
  const float* column_scales() const { return column_scales_.data(); }              // [panels * 16]
  const int32_t* column_corrections() const { return column_corrections_.data(); }  // [panels * 16]

 private:
  PackedInt8Matrix(int64_t rows, int64_t cols, bool gate_up);
  // Packed column of logical row `row`.
  int64_t column_of(int64_t row) const;
  // Writes logical row `row` (k int8 values, scale) into the packed layout.
  void set_row(int64_t row, const int8_t* values, float scale);

  template <typename T>
  static Result<PackedInt8Matrix> quantize_rows(std::span<const MatrixView<T>> parts, bool gate_up);
  static Result<PackedInt8Matrix> pack_rows(std::span<const Int8WeightsView> parts, bool gate_up);

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  bool gate_up_ = false;
  int64_t panels_ = 0;
  int64_t k_groups_ = 0;
  int64_t panel_stride_ = 0;
  AlignedBuffer storage_;  // the panels, zero-padded
  std::vector<float> column_scales_;
  std::vector<int32_t> column_corrections_;
};

}  // namespace peerserve::kernels
