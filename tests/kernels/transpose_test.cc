// kernels::transpose against the element-by-element definition, for shapes around the tile
// size and with padded strides (whose padding must stay untouched).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/transpose.h"

namespace peerserve::kernels {
namespace {

TEST(Transpose, EqualsTheDefinitionAndWritesNothingElse) {
  const int64_t sizes[] = {1, 2, 15, 16, 17, 33, 100};
  constexpr float kUntouched = -1.0f;
  for (int64_t rows : sizes) {
    for (int64_t cols : sizes) {
      const int64_t src_stride = cols + 3, dst_stride = rows + 5;
      std::vector<float> src(rows * src_stride);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
      std::vector<float> dst(cols * dst_stride, kUntouched);
      transpose(src.data(), src_stride, rows, cols, dst.data(), dst_stride);
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < dst_stride; ++r) {
          const float want = r < rows ? src[r * src_stride + c] : kUntouched;
          ASSERT_EQ(dst[c * dst_stride + r], want)
              << rows << "x" << cols << " at " << r << "," << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace peerserve::kernels
