#include "kernels/bf16_matrix.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/check.h"

namespace peerserve::kernels {
namespace {

constexpr int64_t kPanel = PackedBf16Matrix::kPanelColumns;
constexpr int64_t kGroup = PackedBf16Matrix::kGroupK;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

int64_t PackedBf16Matrix::panel_stride_for(int64_t cols) {
  const int64_t stride = ceil_div(cols, kGroup) * kGroup * kPanel;
  return stride > 0 && (stride * 2) % 4096 == 0 ? stride + 32 : stride;
}

PackedBf16Matrix::PackedBf16Matrix(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {
  panels_ = ceil_div(rows, kPanel);
  k_pairs_ = ceil_div(cols, kGroup);
  panel_stride_ = panel_stride_for(cols);
  const int64_t bytes = std::max<int64_t>(64, panels_ * panel_stride_ * 2);
  Result<AlignedBuffer> storage = AlignedBuffer::allocate(bytes);
  PS_CHECK(storage.ok()) << "packing a bf16 matrix: " << storage.status().message();
  storage_ = std::move(storage).value();
}

Result<PackedBf16Matrix> PackedBf16Matrix::pack(MatrixView<bf16> w) {
  if (w.rows < 0 || w.cols < 0) {
    return invalid_argument("pack bf16: negative shape [" + std::to_string(w.rows) + ", " +
                            std::to_string(w.cols) + "]");
  }
  if (w.stride != 0 && w.stride < w.cols) {
    return invalid_argument("pack bf16: row stride " + std::to_string(w.stride) + " is below the " +
                            std::to_string(w.cols) + " columns");
  }
  if (w.data == nullptr && w.rows > 0 && w.cols > 0) {
    return invalid_argument("pack bf16: null data for a [" + std::to_string(w.rows) + ", " +
                            std::to_string(w.cols) + "] matrix");
  }
  const int64_t stride = w.stride == 0 ? w.cols : w.stride;
  PackedBf16Matrix m(w.rows, w.cols);
  // Panel by panel, k pair by k pair: each 64-byte destination line is written in order
  // from the same pair of its 16 source rows (16 sequential read streams, one write stream).
  const int64_t full_pairs = w.cols / kGroup;
  for (int64_t panel = 0; panel < m.panels_; ++panel) {
    const int64_t c0 = panel * kPanel, count = std::min(kPanel, w.rows - c0);
    uint16_t* dst = reinterpret_cast<uint16_t*>(m.storage_.data()) + panel * m.panel_stride_;
    const uint16_t* src[kPanel];
    for (int64_t c = 0; c < count; ++c) src[c] = &w.data[(c0 + c) * stride].bits;
    for (int64_t g = 0; g < full_pairs; ++g) {
      uint16_t* line = dst + kGroup * kPanel * g;
      for (int64_t c = 0; c < count; ++c) std::memcpy(line + kGroup * c, src[c] + kGroup * g, 4);
    }
    if (w.cols % kGroup != 0) {  // the last pair's second element stays zero
      uint16_t* line = dst + kGroup * kPanel * full_pairs;
      for (int64_t c = 0; c < count; ++c) line[kGroup * c] = src[c][kGroup * full_pairs];
    }
  }
  return m;
}

bf16 PackedBf16Matrix::value(int64_t row, int64_t col) const {
  PS_CHECK(row >= 0 && row < rows_ && col >= 0 && col < cols_)
      << "PackedBf16Matrix::value(" << row << ", " << col << ") outside [" << rows_ << ", " << cols_
      << "]";
  bf16 v;
  v.bits = panel_data()[static_cast<size_t>(panel_stride_ * (row / kPanel) +
                                            kGroup * kPanel * (col / kGroup) +
                                            kGroup * (row % kPanel) + col % kGroup)];
  return v;
}

}  // namespace peerserve::kernels
