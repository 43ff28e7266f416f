#include "model/checkpoint/fp8_block_scaling.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "base/check.h"

namespace peerserve {
namespace {

void check_shape(const Fp8BlockShape& s) {
  PS_CHECK(s.rows >= 0 && s.cols >= 0 && s.block_rows > 0 && s.block_cols > 0)
      << "fp8 block shape " << s.rows << "x" << s.cols << " blocks " << s.block_rows << "x"
      << s.block_cols;
}

// All 256 E4M3 codes as floats, so the inner loop is a table lookup.
const std::array<float, 256>& f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i)
      t[static_cast<size_t>(i)] = f8e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

int64_t dequantize_fp8_blocks_to_bf16(const Fp8BlockShape& shape, std::span<const uint8_t> weight,
                                      std::span<const float> scale_inv, std::span<bf16> out) {
  check_shape(shape);
  const size_t n = static_cast<size_t>(shape.rows * shape.cols);
  PS_CHECK_EQ(weight.size(), n);
  PS_CHECK_EQ(out.size(), n);
  PS_CHECK_EQ(scale_inv.size(), static_cast<size_t>(shape.scale_rows() * shape.scale_cols()));
  const std::array<float, 256>& table = f8e4m3_table();
  const size_t cols = static_cast<size_t>(shape.cols);
  int64_t first_nan = -1;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* scale_row = scale_inv.data() + (r / shape.block_rows) * shape.scale_cols();
    const uint8_t* w = weight.data() + static_cast<size_t>(r) * cols;
    bf16* o = out.data() + static_cast<size_t>(r) * cols;
    // The NaN codes (0x7f, 0xff) are noted on the way, branch-free; found in the row after.
    bool nan_code = false;
    for (int64_t c0 = 0; c0 < shape.cols; c0 += shape.block_cols) {
      const float s = scale_row[c0 / shape.block_cols];
      const int64_t c1 = std::min(shape.cols, c0 + shape.block_cols);
      for (int64_t c = c0; c < c1; ++c) {
        o[c] = float_to_bf16(table[w[c]] * s);
        nan_code |= (w[c] & 0x7f) == 0x7f;
      }
    }
    if (nan_code && first_nan < 0) {
      const uint8_t* at = std::find_if(w, w + cols, [](uint8_t v) { return (v & 0x7f) == 0x7f; });
      first_nan = r * shape.cols + (at - w);
    }
  }
  return first_nan;
}

Fp8BlockQuantized quantize_fp8_blocks(const Fp8BlockShape& shape, std::span<const float> values) {
  check_shape(shape);
  PS_CHECK_EQ(values.size(), static_cast<size_t>(shape.rows * shape.cols));
  Fp8BlockQuantized q;
  q.weight.resize(values.size());
  q.scale_inv.resize(static_cast<size_t>(shape.scale_rows() * shape.scale_cols()));
  for (int64_t br = 0; br < shape.scale_rows(); ++br) {
    const int64_t r0 = br * shape.block_rows, r1 = std::min(shape.rows, r0 + shape.block_rows);
    for (int64_t bc = 0; bc < shape.scale_cols(); ++bc) {
      const int64_t c0 = bc * shape.block_cols, c1 = std::min(shape.cols, c0 + shape.block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(values[static_cast<size_t>(r * shape.cols + c)]));
        }
      }
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      q.scale_inv[static_cast<size_t>(br * shape.scale_cols() + bc)] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = static_cast<size_t>(r * shape.cols + c);
          q.weight[i] = float_to_f8e4m3(values[i] / scale);
        }
      }
    }
  }
  return q;
}

}  // namespace peerserve
