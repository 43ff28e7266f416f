#include "kernels/quantize_rows.h"

#include "kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace peerserve::kernels {
namespace {

TEST(QuantizeRowsInt8, MatchesADoubleReferenceAndRoundTripsWithinHalfAStep) {
  std::mt19937 rng(11);
  const int64_t rows = 37, cols = 300, stride = 310;
  std::vector<float> x(rows * stride, 1e30f);  // padding must not be read
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(i % 17) - 8);
    for (int64_t k = 0; k < cols; ++k) x[i * stride + k] = magnitude * normal(rng);
  }
  for (int64_t k = 0; k < cols; ++k) x[5 * stride + k] = 0.0f;  // an all-zero row
  x[6 * stride + 3] = -1000.0f;                                 // an outlier sets the scale

  std::vector<int8_t> q(rows * cols);
  std::vector<float> scales(rows);
  quantize_rows_int8(x.data(), rows, cols, stride, q.data(), scales.data());
  std::vector<float> back(rows * cols);
  dequantize_rows_int8(q.data(), scales.data(), rows, cols, back.data(), cols);

  for (int64_t i = 0; i < rows; ++i) {
    double amax = 0.0;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(double{x[i * stride + k]}));
    const double scale = amax / 127.0;
    EXPECT_NEAR(scales[i], scale, scale * 1e-6) << "row " << i;
    // The header's formula in the same fp32 operations: one multiply, then nearbyint (ties
    // to even), so the codes must match exactly.
    const float inverse = 127.0f / static_cast<float>(amax);
    for (int64_t k = 0; k < cols; ++k) {
      const double value = x[i * stride + k];
      const float reference = amax == 0.0 ? 0.0f : std::nearbyint(x[i * stride + k] * inverse);
      EXPECT_EQ(q[i * cols + k], static_cast<int>(reference)) << i << "," << k;
      EXPECT_GE(q[i * cols + k], -127);
      // Round trip: half a step, plus fp32 rounding of the scale and the product.
      EXPECT_LE(std::fabs(back[i * cols + k] - value), scale * (0.5 + 1e-5) + 1e-30)
          << i << "," << k;
    }
  }
  EXPECT_EQ(scales[5], 0.0f);
  EXPECT_EQ(q[6 * cols + 3], -127);
}

TEST(QuantizeRowsInt8, EveryIsaLevelGivesTheSameBits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  // Bodies and tails of the 16-lane (AVX-512) and 32-value (AVX2) loops.
  for (int64_t cols : {1, 15, 16, 17, 31, 32, 33, 63, 65, 100, 1024, 1030}) {
    std::vector<float> x(3 * cols);
    for (float& v : x) v = normal(rng);
    x[cols / 2] = 0.5f * 127.0f / 64.0f;  // lands on a tie after scaling in some rows
    x[2 * cols - 1] = -50.0f;             // row 1's maximum in its last element
    std::vector<int8_t> reference(x.size());
    std::vector<float> reference_scales(3);
    {
      ScopedIsaLevel scalar(IsaLevel::kScalar);
      quantize_rows_int8(x.data(), 3, cols, cols, reference.data(), reference_scales.data());
    }
    for (IsaLevel level : supported_isa_levels()) {
      ScopedIsaLevel scoped(level);
      std::vector<int8_t> q(x.size());
      std::vector<float> scales(3);
      quantize_rows_int8(x.data(), 3, cols, cols, q.data(), scales.data());
      EXPECT_EQ(q, reference) << isa_level_name(level) << ", cols " << cols;
      EXPECT_EQ(scales, reference_scales) << isa_level_name(level);
    }
  }
}

TEST(QuantizeRowsInt8, HalfStepsRoundToEvenAtEveryIsaLevel) {
  // max |x| = 127 makes the multiplier exactly 1, so every .5 below is a tie after scaling;
  // half away from zero would give 1, 3, -1, -2, 127. The ties sit in the vector body and in
  // the tail of the AVX-512 loop (16 lanes).
  const std::vector<float> ties = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f};
  const std::vector<int> expected = {0, 2, 2, 0, -2, -2, 126, -126};
  const int64_t cols = 37;
  std::vector<float> x(cols, 0.0f);
  x[0] = 127.0f;
  const std::vector<int64_t> positions = {1, 2, 3, 9, 17, 30, 33, 36};
  for (size_t t = 0; t < ties.size(); ++t) x[positions[t]] = ties[t];
  for (IsaLevel level : supported_isa_levels()) {
    ScopedIsaLevel scoped(level);
    std::vector<int8_t> q(cols);
    float scale = 0.0f;
    quantize_rows_int8(x.data(), 1, cols, cols, q.data(), &scale);
    EXPECT_EQ(scale, 1.0f);
    EXPECT_EQ(q[0], 127);
    for (size_t t = 0; t < ties.size(); ++t) {
      EXPECT_EQ(q[positions[t]], expected[t]) << isa_level_name(level) << ": " << ties[t];
    }
  }
}

TEST(QuantizeRowsInt8, TinyRowsKeepTheirShape) {
  // max |x| so small that 127 / max overflows: still quantized to the full int8 range.
  const float x[4] = {1e-38f, -5e-39f, 0.0f, 2.5e-39f};
  int8_t q[4];
  float scale = 0.0f;
  quantize_rows_int8(x, 1, 4, 4, q, &scale);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 rounds to even
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 32);  // 31.75
  EXPECT_GT(scale, 0.0f);
}

// A row holding NaN or inf (in the vector body or the tail) dequantizes to NaN at every
// level; its neighbours keep their bits. It used to end the process (a CHECK), which under
// --ep took the whole job down over one damaged activation.
TEST(QuantizeRowsInt8, NonFiniteRowsDequantizeToNaN) {
  const int64_t cols = 37;
  std::vector<float> x(3 * cols);
  for (int64_t c = 0; c < 3 * cols; ++c) x[c] = 0.25f * static_cast<float>(c % 11) - 1.0f;
  std::vector<int8_t> clean_q(cols);
  float clean_scale = 0.0f;
  quantize_rows_int8(x.data() + 2 * cols, 1, cols, cols, clean_q.data(), &clean_scale);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[cols + 36] = std::numeric_limits<float>::infinity();
  for (IsaLevel level : supported_isa_levels()) {
    ScopedIsaLevel scoped(level);
    std::vector<int8_t> q(x.size(), 1);
    std::vector<float> scales(3);
    quantize_rows_int8(x.data(), 3, cols, cols, q.data(), scales.data());
    std::vector<float> back(x.size());
    dequantize_rows_int8(q.data(), scales.data(), 3, cols, back.data(), cols);
    for (int64_t c = 0; c < 2 * cols; ++c) {
      EXPECT_TRUE(std::isnan(back[c])) << isa_level_name(level) << " " << c;
    }
    EXPECT_EQ(scales[2], clean_scale) << isa_level_name(level);
    EXPECT_TRUE(std::equal(clean_q.begin(), clean_q.end(), q.begin() + 2 * cols));
  }
}

}  // namespace
}  // namespace peerserve::kernels
