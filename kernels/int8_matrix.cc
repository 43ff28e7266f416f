#include "kernels/int8_matrix.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "base/check.h"

namespace peerserve::kernels {
namespace {

constexpr int64_t kPanel = PackedInt8Matrix::kPanelColumns;
constexpr int64_t kGroup = PackedInt8Matrix::kGroupK;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

template <typename T>
Status check_view(const MatrixView<T>& v, const char* what) {
  if (v.rows < 0 || v.cols < 0) {
    return invalid_argument(std::string(what) + ": negative shape [" + std::to_string(v.rows) +
                            ", " + std::to_string(v.cols) + "]");
  }
  if (v.cols > kMaxInt8Cols) {
    return invalid_argument(std::string(what) + ": " + std::to_string(v.cols) +
                            " columns, at most " + std::to_string(kMaxInt8Cols) +
                            " fit the int32 accumulation");
  }
  if (v.stride != 0 && v.stride < v.cols) {
    return invalid_argument(std::string(what) + ": row stride " + std::to_string(v.stride) +
                            " is below the " + std::to_string(v.cols) + " columns");
  }
  if (v.data == nullptr && v.rows > 0 && v.cols > 0) {
    return invalid_argument(std::string(what) + ": null data for a [" + std::to_string(v.rows) +
                            ", " + std::to_string(v.cols) + "] matrix");
  }
  return ok_status();
}

Status check_same_shape(int64_t gate_rows, int64_t gate_cols, int64_t up_rows, int64_t up_cols) {
  if (gate_rows != up_rows || gate_cols != up_cols) {
    return invalid_argument("gate/up: gate is [" + std::to_string(gate_rows) + ", " +
                            std::to_string(gate_cols) + "] but up is [" + std::to_string(up_rows) +
                            ", " + std::to_string(up_cols) + "]");
  }
  return ok_status();
}

float to_float(float v) {
  return v;
}
float to_float(bf16 v) {
  return bf16_to_float(v);
}

// The largest |w[p]| as its sign-cleared bit pattern: for finite floats the integer order is
// the float order, and the result is >= 0x7f800000 exactly when some value is inf or NaN. A
// reduction the compiler vectorizes (this file is built with -O3).
uint32_t max_magnitude_bits(const float* w, int64_t k) {
  uint32_t max_bits = 0;
  for (int64_t p = 0; p < k; ++p) {
    max_bits = std::max(max_bits, std::bit_cast<uint32_t>(w[p]) & 0x7fffffffu);
  }
  return max_bits;
}

// Symmetric round-to-nearest quantization of one finite row whose largest magnitude is
// `absmax`, with the range clipped to ratio * absmax (see int8_matrix.h); returns the scale.
// nearbyint is adding and subtracting 1.5 * 2^23, which rounds |v| < 2^22 to the nearest
// integer, ties to even, in the default rounding mode — the same values as the library
// call, which cost a call per weight; the loop vectorizes.
float quantize_row(const float* w, int64_t k, float absmax, int8_t* q, float ratio = 1.0f) {
  absmax *= ratio;  // exact for ratio 1
  if (absmax == 0.0f) {
    std::fill_n(q, k, int8_t{0});
    return 0.0f;
  }
  constexpr float kRound = 12582912.0f;
  const float inv = 127.0f / absmax;
  if (!std::isfinite(inv)) {  // absmax below 127 / FLT_MAX (~3.7e-37): divide instead
    for (int64_t p = 0; p < k; ++p) {
      const float v = std::clamp(std::nearbyint(w[p] / absmax * 127.0f), -127.0f, 127.0f);
      q[p] = static_cast<int8_t>(static_cast<int32_t>(v));
    }
    return absmax / 127.0f;
  }
  for (int64_t p = 0; p < k; ++p) {
    // Unclipped, |w[p] * inv| <= 127 (1 + 2^-22) < 2^22, where the trick is exact. Clipped,
    // a value can be larger: its rounding may then be off, but it stays far beyond 127 with
    // its sign, and the clamp gives +-127 as for an exact rounding.
    const float v = std::clamp((w[p] * inv + kRound) - kRound, -127.0f, 127.0f);
    q[p] = static_cast<int8_t>(static_cast<int32_t>(v));
  }
  return absmax / 127.0f;
}

float absmax_of(std::span<const float> w) {
  return std::bit_cast<float>(max_magnitude_bits(w.data(), static_cast<int64_t>(w.size())));
}

}  // namespace

float quantize_int8_row(std::span<const float> w, std::span<int8_t> q) {
  PS_CHECK(w.size() == q.size());
  return quantize_row(w.data(), static_cast<int64_t>(w.size()), absmax_of(w), q.data());
}

float quantize_int8_row_clipped(std::span<const float> w, float ratio, std::span<int8_t> q) {
  PS_CHECK(w.size() == q.size());
  PS_CHECK(ratio > 0.0f && ratio <= 1.0f) << "clipping ratio " << ratio;
  return quantize_row(w.data(), static_cast<int64_t>(w.size()), absmax_of(w), q.data(), ratio);
}

PackedInt8Matrix::PackedInt8Matrix(int64_t rows, int64_t cols, bool gate_up)
    : rows_(rows), cols_(cols), gate_up_(gate_up) {
  panels_ = gate_up ? 2 * ceil_div(rows / 2, kPanel) : ceil_div(rows, kPanel);
  k_groups_ = ceil_div(cols, kGroup);
  panel_stride_ = k_groups_ * kGroup * kPanel;
  if (panel_stride_ > 0 && panel_stride_ % 4096 == 0) panel_stride_ += 64;
  const int64_t bytes = std::max<int64_t>(64, panels_ * panel_stride_);
  Result<AlignedBuffer> storage = AlignedBuffer::allocate(bytes);
  PS_CHECK(storage.ok()) << "packing an int8 matrix: " << storage.status().message();
  storage_ = std::move(storage).value();
  column_scales_.assign(static_cast<size_t>(panels_ * kPanel), 0.0f);
  column_corrections_.assign(static_cast<size_t>(panels_ * kPanel), 0);
}

int64_t PackedInt8Matrix::column_of(int64_t row) const {
  if (!gate_up_) return row;
  const int64_t intermediate = rows_ / 2;
  const bool up = row >= intermediate;
  const int64_t r = up ? row - intermediate : row;
  return 2 * kPanel * (r / kPanel) + (up ? kPanel : 0) + r % kPanel;
}

void PackedInt8Matrix::set_row(int64_t row, const int8_t* values, float scale) {
  const int64_t c = column_of(row);
  int8_t* panel = reinterpret_cast<int8_t*>(storage_.data()) + panel_stride_ * (c / kPanel) +
                  kGroup * (c % kPanel);
  // A group of kGroup consecutive k is contiguous in the panel: one 4-byte copy per group
  // (a load's worth of the packing time was byte stores).
  const int64_t full_groups = cols_ / kGroup;
  for (int64_t g = 0; g < full_groups; ++g) {
    std::memcpy(panel + kGroup * kPanel * g, values + kGroup * g, kGroup);
  }
  for (int64_t p = full_groups * kGroup; p < cols_; ++p) {
    panel[kGroup * kPanel * full_groups + p % kGroup] = values[p];
  }
  int32_t sum = 0;
  for (int64_t p = 0; p < cols_; ++p) sum += values[p];
  column_scales_[static_cast<size_t>(c)] = scale;
  column_corrections_[static_cast<size_t>(c)] = 128 * sum;
}

template <typename T>
Result<PackedInt8Matrix> PackedInt8Matrix::quantize_rows(std::span<const MatrixView<T>> parts,
                                                         bool gate_up) {
  const char* what = gate_up ? "quantize_gate_up" : "quantize";
  for (const MatrixView<T>& v : parts) PS_RETURN_IF_ERROR(check_view(v, what));
  if (gate_up) {
    PS_RETURN_IF_ERROR(
        check_same_shape(parts[0].rows, parts[0].cols, parts[1].rows, parts[1].cols));
  }
  int64_t rows = 0;
  for (const MatrixView<T>& v : parts) rows += v.rows;
  const int64_t cols = parts[0].cols;
  PackedInt8Matrix m(rows, cols, gate_up);
  std::vector<float> row_f(static_cast<size_t>(cols));
  std::vector<int8_t> row_q(static_cast<size_t>(cols));
  int64_t row = 0;
  for (size_t part = 0; part < parts.size(); ++part) {
    const MatrixView<T>& v = parts[part];
    // Which matrix a bad weight is in, as pack_gate_up says.
    const std::string of = gate_up ? (part == 0 ? " of gate" : " of up") : "";
    const int64_t stride = v.stride == 0 ? v.cols : v.stride;
    for (int64_t r = 0; r < v.rows; ++r, ++row) {
      // Convert, and find the largest magnitude in the same pass (as max_magnitude_bits):
      // it is the finiteness check (the column is searched for only on error) and the
      // row's absmax.
      uint32_t max_bits = 0;
      for (int64_t p = 0; p < cols; ++p) {
        const float f = to_float(v.data[r * stride + p]);
        row_f[static_cast<size_t>(p)] = f;
        max_bits = std::max(max_bits, std::bit_cast<uint32_t>(f) & 0x7fffffffu);
      }
      if (max_bits >= 0x7f800000u) {
        const int64_t p =
            std::find_if(row_f.begin(), row_f.end(), [](float f) { return !std::isfinite(f); }) -
            row_f.begin();
        return invalid_argument(std::string(what) + ": weight at row " + std::to_string(r) +
                                ", column " + std::to_string(p) + of + " is not finite");
      }
      const float scale =
          quantize_row(row_f.data(), cols, std::bit_cast<float>(max_bits), row_q.data());
      m.set_row(row, row_q.data(), scale);
    }
  }
  return m;
}

Result<PackedInt8Matrix> PackedInt8Matrix::pack_rows(std::span<const Int8WeightsView> parts,
                                                     bool gate_up) {
  const char* what = gate_up ? "pack_gate_up" : "pack";
  for (const Int8WeightsView& v : parts) {
    PS_RETURN_IF_ERROR(check_view(v.values, what));
    if (v.scales == nullptr && v.values.rows > 0) {
      return invalid_argument(std::string(what) + ": null scales for " +
                              std::to_string(v.values.rows) + " rows");
    }
  }
  if (gate_up) {
    PS_RETURN_IF_ERROR(check_same_shape(parts[0].values.rows, parts[0].values.cols,
                                        parts[1].values.rows, parts[1].values.cols));
  }
  int64_t rows = 0;
  for (const Int8WeightsView& v : parts) rows += v.values.rows;
  const int64_t cols = parts[0].values.cols;
  PackedInt8Matrix m(rows, cols, gate_up);
  int64_t row = 0;
  for (size_t part = 0; part < parts.size(); ++part) {
    const Int8WeightsView& v = parts[part];
    // Which input a row index refers to: the gate/up form is packed from two.
    const std::string of = gate_up ? (part == 0 ? " of gate" : " of up") : "";
    const int64_t stride = v.values.stride == 0 ? v.values.cols : v.values.stride;
    for (int64_t r = 0; r < v.values.rows; ++r, ++row) {
      const int8_t* values = v.values.data + r * stride;
      // The row's minimum first (a loop the compiler vectorizes); the column only on error.
      int8_t lowest = 0;
      for (int64_t p = 0; p < cols; ++p) lowest = std::min(lowest, values[p]);
      if (lowest == -128) {
        const int64_t p = std::find(values, values + cols, int8_t{-128}) - values;
        return invalid_argument(std::string(what) + ": value -128 at row " + std::to_string(r) +
                                of + ", column " + std::to_string(p) +
                                " (symmetric int8 weights are in [-127, 127])");
      }
      const float scale = v.scales[r];
      if (!std::isfinite(scale) || scale < 0.0f) {
        return invalid_argument(std::string(what) + ": scale of row " + std::to_string(r) + of +
                                " is " + std::to_string(scale) + ", expected finite and >= 0");
      }
      m.set_row(row, values, scale);
    }
  }
  return m;
}

Result<PackedInt8Matrix> PackedInt8Matrix::quantize(MatrixView<bf16> w) {
  return quantize_rows<bf16>(std::span<const MatrixView<bf16>>(&w, 1), false);
}

Result<PackedInt8Matrix> PackedInt8Matrix::quantize(MatrixView<float> w) {
  return quantize_rows<float>(std::span<const MatrixView<float>>(&w, 1), false);
}

Result<PackedInt8Matrix> PackedInt8Matrix::pack(const Int8WeightsView& w) {
  return pack_rows(std::span<const Int8WeightsView>(&w, 1), false);
}

Result<PackedInt8Matrix> PackedInt8Matrix::quantize_gate_up(MatrixView<bf16> gate,
                                                            MatrixView<bf16> up) {
  const MatrixView<bf16> parts[] = {gate, up};
  return quantize_rows<bf16>(parts, true);
}

Result<PackedInt8Matrix> PackedInt8Matrix::quantize_gate_up(MatrixView<float> gate,
                                                            MatrixView<float> up) {
  const MatrixView<float> parts[] = {gate, up};
  return quantize_rows<float>(parts, true);
}

Result<PackedInt8Matrix> PackedInt8Matrix::pack_gate_up(const Int8WeightsView& gate,
                                                        const Int8WeightsView& up) {
  const Int8WeightsView parts[] = {gate, up};
  return pack_rows(parts, true);
}

int8_t PackedInt8Matrix::value(int64_t row, int64_t col) const {
  PS_CHECK(row >= 0 && row < rows_ && col >= 0 && col < cols_)
      << "int8 matrix [" << rows_ << ", " << cols_ << "]: no element (" << row << ", " << col
      << ")";
  const int64_t c = column_of(row);
  return panel_data()[static_cast<size_t>(panel_stride_ * (c / kPanel) +
                                          kGroup * kPanel * (col / kGroup) + kGroup * (c % kPanel) +
                                          col % kGroup)];
}

float PackedInt8Matrix::scale(int64_t row) const {
  PS_CHECK(row >= 0 && row < rows_) << "int8 matrix with " << rows_ << " rows: no row " << row;
  return column_scales_[static_cast<size_t>(column_of(row))];
}

void PackedInt8Matrix::dequantized_row(int64_t row, std::span<float> out) const {
  PS_CHECK(static_cast<int64_t>(out.size()) == cols_)
      << "dequantized_row: " << out.size() << " outputs for " << cols_ << " columns";
  const float s = scale(row);
  for (int64_t p = 0; p < cols_; ++p) out[static_cast<size_t>(p)] = value(row, p) * s;
}

int64_t PackedInt8Matrix::bytes() const {
  return panels_ * panel_stride_ +
         static_cast<int64_t>(column_scales_.size() * (sizeof(float) + sizeof(int32_t)));
}

}  // namespace peerserve::kernels
