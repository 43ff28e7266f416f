#include "kernels/bf16_panels.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "base/check.h"
#include "kernels/bf16_convert.h"
#include "kernels/bf16_matrix.h"
#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels {
namespace {

constexpr int64_t kPanel = PackedBf16Matrix::kPanelColumns;

// One k pair of one column: the two bf16 a vdpbf16ps lane multiplies, low element first.
void store_pair(uint16_t* at, uint16_t lo, uint16_t hi) {
  const uint16_t pair[2] = {lo, hi};
  std::memcpy(at, pair, sizeof pair);
}

}  // namespace

void Bf16Panels::reset(int64_t rows, int64_t cols) {
  PS_CHECK(rows >= 1 && cols >= 1) << "bf16 panels: " << rows << " x " << cols;
  const int64_t num_panels = (rows + kPanel - 1) / kPanel;
  panel_stride_ = PackedBf16Matrix::panel_stride_for(cols);
  const int64_t bytes = num_panels * panel_stride_ * static_cast<int64_t>(sizeof(uint16_t));
  // The fills write lanes < rows only; the last panel's other lanes feed outputs that are
  // never stored, but stay zero so that they hold no stale NaN. They still are when the
  // shape is the previous one (the fills since never wrote them): a decode step repacks a
  // query's heads for every row without clearing a panel each time.
  bool clear = rows != rows_ || cols != cols_;
  if (storage_.size() < bytes) {
    Result<AlignedBuffer> storage = AlignedBuffer::allocate(bytes);
    PS_CHECK(storage.ok()) << "bf16 panels: " << storage.status().message();
    storage_ = std::move(storage).value();
    clear = false;  // allocated zero-filled
  }
  rows_ = rows;
  cols_ = cols;
  if (clear && rows % kPanel != 0) {
    std::fill_n(panels() + (num_panels - 1) * panel_stride_, panel_stride_, uint16_t{0});
  }
}

void Bf16Panels::fill_rows(const float* w, int64_t stride, int64_t col0, int64_t width) {
  PS_CHECK(col0 >= 0 && col0 % 2 == 0 && width >= 1 && col0 + width <= cols_ && stride >= width)
      << "bf16 panels: fill_rows col0=" << col0 << " width=" << width << " stride=" << stride
      << " into " << rows_ << " x " << cols_;
  thread_local std::vector<bf16> row;
  row.resize(static_cast<size_t>(width));
  const int64_t first_pair = col0 / 2, pairs = (width + 1) / 2;
  for (int64_t j = 0; j < rows_; ++j) {
    fp32_to_bf16(w + j * stride, row.data(), width);
    uint16_t* lane = panels() + (j / kPanel) * panel_stride_ + 2 * (j % kPanel);
    for (int64_t g = 0; g < pairs; ++g) {
      const uint16_t hi = 2 * g + 1 < width ? row[static_cast<size_t>(2 * g + 1)].bits : 0;
      store_pair(lane + 2 * kPanel * (first_pair + g), row[static_cast<size_t>(2 * g)].bits, hi);
    }
  }
}

void Bf16Panels::fill_transposed(const float* w, int64_t stride) {
  PS_CHECK(stride >= rows_) << "bf16 panels: fill_transposed stride=" << stride << " for " << rows_
                            << " rows";
  thread_local std::vector<bf16> lo, hi;
  lo.resize(static_cast<size_t>(rows_));
  hi.resize(static_cast<size_t>(rows_));
  const int64_t pairs = (cols_ + 1) / 2, num_panels = (rows_ + kPanel - 1) / kPanel;
  for (int64_t g = 0; g < pairs; ++g) {
    fp32_to_bf16(w + 2 * g * stride, lo.data(), rows_);
    if (2 * g + 1 < cols_) {
      fp32_to_bf16(w + (2 * g + 1) * stride, hi.data(), rows_);
    } else {
      std::fill(hi.begin(), hi.end(), bf16{0});
    }
    for (int64_t panel = 0; panel < num_panels; ++panel) {
      uint16_t* line = panels() + panel * panel_stride_ + 2 * kPanel * g;
      const int64_t lanes = std::min(kPanel, rows_ - panel * kPanel);
      const bf16* l = lo.data() + panel * kPanel;
      const bf16* h = hi.data() + panel * kPanel;
      for (int64_t c = 0; c < lanes; ++c) store_pair(line + 2 * c, l[c].bits, h[c].bits);
    }
  }
}

void Bf16Panels::multiply(const bf16* x, int64_t x_stride, int64_t m, int64_t n_limit,
                          int64_t k_limit, float* y, int64_t y_stride, bool accumulate) const {
  const int64_t k_pairs = (k_limit + 1) / 2;
  PS_CHECK(m >= 0 && n_limit >= 1 && n_limit <= rows_ && k_limit >= 0 && k_limit <= cols_ &&
           x_stride % 2 == 0 && x_stride >= 2 * k_pairs && y_stride >= n_limit)
      << "bf16 panels: multiply m=" << m << " n_limit=" << n_limit << " k_limit=" << k_limit
      << " x_stride=" << x_stride << " y_stride=" << y_stride << " over " << rows_ << " x "
      << cols_;
  if (m == 0) return;
  if (k_pairs == 0) {  // an empty sum
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * y_stride, n_limit, 0.0f);
    }
    return;
  }
  internal::PackedBf16Tile tile;
  tile.x = &x->bits;
  tile.x_stride = x_stride;
  tile.m = m;
  tile.w = panels();
  tile.panel_stride = panel_stride_;
  tile.k_pairs = k_pairs;
  tile.panel_begin = 0;
  tile.panel_end = (n_limit + kPanel - 1) / kPanel;
  tile.y = y;
  tile.y_stride = y_stride;
  tile.n = n_limit;
  tile.accumulate = accumulate;
  internal::active_kernel_table().matmul_packed_bf16(tile);
}

}  // namespace peerserve::kernels
