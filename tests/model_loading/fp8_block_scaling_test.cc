#include "model/checkpoint/fp8_block_scaling.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/checkpoint/deterministic_normal.h"

namespace peerserve {
namespace {

// E4M3 decoded straight from the OCP definition with std::pow, independent of the table and
// ldexp code under test: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8, 0x7f/0xff NaN.
double reference_e4m3(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return NAN;
  const double magnitude =
      e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s ? -magnitude : magnitude;
}

// The plain reference: one element at a time, block index from integer division.
std::vector<float> reference_dequant(const std::vector<uint8_t>& w, const std::vector<float>& s,
                                     int64_t rows, int64_t cols, int64_t br, int64_t bc) {
  const int64_t scale_cols = (cols + bc - 1) / bc;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = reference_e4m3(w[static_cast<size_t>(r * cols + c)]);
      out[static_cast<size_t>(r * cols + c)] =
          static_cast<float>(x * s[static_cast<size_t>((r / br) * scale_cols + c / bc)]);
    }
  }
  return out;
}

TEST(Fp8Test, KnownCodes) {
  EXPECT_EQ(f8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(f8e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  for (int v = 0; v < 256; ++v) {
    const double expected = reference_e4m3(static_cast<uint8_t>(v));
    const float actual = f8e4m3_to_float(static_cast<uint8_t>(v));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << v;
    } else {
      EXPECT_EQ(static_cast<double>(actual), expected) << v;
    }
  }
}

struct DequantCase {
  int64_t rows, cols, block_rows, block_cols;
};

class Fp8DequantTest : public ::testing::TestWithParam<DequantCase> {};

// Every element matches the reference after rounding to BF16 exactly (both round the same
// float product, so the comparison is bit-exact), including the partial edge blocks.
TEST_P(Fp8DequantTest, MatchesPlainReference) {
  const DequantCase p = GetParam();
  const Fp8BlockShape shape{p.rows, p.cols, p.block_rows, p.block_cols};
  DeterministicNormal rng(42);
  std::vector<uint8_t> w(static_cast<size_t>(p.rows * p.cols));
  for (uint8_t& v : w) {
    v = static_cast<uint8_t>(rng.next_u64());
    if ((v & 0x7f) == 0x7f) v = 0x00;  // no NaN codes
  }
  std::vector<float> s(static_cast<size_t>(shape.scale_rows() * shape.scale_cols()));
  for (float& v : s)
    v = static_cast<float>(std::exp2(static_cast<double>(rng.next_u64() % 16) - 12.0) * 1.37);
  std::vector<bf16> out(w.size());
  dequantize_fp8_blocks_to_bf16(shape, w, s, out);
  const std::vector<float> ref =
      reference_dequant(w, s, p.rows, p.cols, p.block_rows, p.block_cols);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i].bits, float_to_bf16(ref[i]).bits)
        << "element " << i << " (row " << i / p.cols << ", col " << i % p.cols << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8DequantTest,
                         ::testing::Values(DequantCase{256, 256, 128, 128},  // whole blocks
                                           DequantCase{300, 200, 128, 128},  // partial both ways
                                           DequantCase{7, 129, 128, 128},    // one partial row
                                           DequantCase{40, 80, 32, 32},      // tiny preset style
                                           DequantCase{33, 17, 16, 8}, DequantCase{1, 1, 128, 128},
                                           DequantCase{0, 5, 128, 128}));

// Quantize then dequantize: each element is within half an E4M3 step of its value. E4M3 has 3
// mantissa bits, so the relative rounding error is at most 2^-4 for normal codes; values in
// the subnormal range of a block (below 2^-6 * scale) have an absolute error of at most
// 2^-10 * scale. BF16 rounding adds 2^-9 relative.
TEST(Fp8Test, QuantizeRoundTripWithinE4M3Precision) {
  const Fp8BlockShape shape{150, 70, 64, 32};
  DeterministicNormal rng(7);
  std::vector<float> values(static_cast<size_t>(shape.rows * shape.cols));
  for (float& v : values) v = static_cast<float>(0.02 * rng.next_normal());
  values[5] = 0.0f;
  const Fp8BlockQuantized q = quantize_fp8_blocks(shape, values);
  ASSERT_EQ(q.scale_inv.size(), static_cast<size_t>(3 * 3));
  std::vector<bf16> out(values.size());
  dequantize_fp8_blocks_to_bf16(shape, q.weight, q.scale_inv, out);
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.cols; ++c) {
      const size_t i = static_cast<size_t>(r * shape.cols + c);
      const float scale = q.scale_inv[static_cast<size_t>((r / 64) * 3 + c / 32)];
      const double tolerance = std::fabs(values[i]) * (0.0625 + 0.002) + std::ldexp(scale, -10);
      EXPECT_NEAR(bf16_to_float(out[i]), values[i], tolerance) << r << "," << c;
    }
  }
  // Zero stays exactly zero.
  EXPECT_EQ(bf16_to_float(out[5]), 0.0f);
}

TEST(Fp8Test, AllZeroBlockHasUnitScale) {
  const Fp8BlockShape shape{4, 4, 2, 2};
  const Fp8BlockQuantized q = quantize_fp8_blocks(shape, std::vector<float>(16, 0.0f));
  for (float s : q.scale_inv) EXPECT_EQ(s, 1.0f);
  for (uint8_t w : q.weight) EXPECT_EQ(w, 0);
}

}  // namespace
}  // namespace peerserve
