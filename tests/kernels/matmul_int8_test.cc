// PackedInt8Matrix and the W8A8 products (matmul_int8, gate_up_silu_int8, grouped forms)
// at every ISA level this CPU has: exact int32 sums against an integer reference, the
// scaled output against a double reference of the quantized operands and against the
// unquantized product within the quantization bound, bitwise agreement between levels,
// and batch invariance (bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "kernels/activation.h"
#include "kernels/int8_matrix.h"
#include "kernels/internal/matmul_int8_hooks.h"
#include "kernels/matmul_int8.h"

namespace peerserve::kernels {
namespace {

using testing::kUnitRoundoff;
using testing::level_label;
using testing::levels_to_test;
using testing::Random;

struct Shape {
  int64_t m, n, k;
};

// m = 0 and 1 (decode), odd n (panel tails) and k (group tails), m crossing the 6-row
// register block and (70 x 4096) the 256 KiB row block, k crossing the 4 KiB panel-stride padding
// (k = 4096).
const Shape kShapes[] = {
    {1, 1, 1},   {0, 5, 7},     {1, 17, 33},   {3, 7, 0},    {5, 37, 100},  {2, 3, 16},
    {7, 64, 32}, {9, 13, 47},   {1, 130, 31},  {4, 64, 257}, {13, 50, 129}, {1, 9, 1000},
    {6, 80, 64}, {8, 33, 4096}, {70, 5, 4096}, {3, 1, 5},    {17, 31, 15},  {25, 100, 300},
};

std::string describe(const Shape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

PackedInt8Matrix random_weights(Random& rng, int64_t n, int64_t k, int64_t stride) {
  std::vector<float> w = rng.floats(static_cast<size_t>(std::max<int64_t>(1, n * stride)));
  // Rows of different magnitude, so that per-row scales matter.
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) w[static_cast<size_t>(j * stride + p)] *= 1.0f + j % 5;
  }
  Result<PackedInt8Matrix> packed =
      PackedInt8Matrix::quantize(MatrixView<float>{w.data(), n, k, stride});
  PS_CHECK(packed.ok()) << packed.status().to_string();
  return std::move(packed).value();
}

// Signed quantized rows of x and their scales, as the active level produces them.
struct QuantizedX {
  std::vector<int8_t> q;  // [m, k]
  std::vector<float> scale;
};

QuantizedX quantize_x(const std::vector<float>& x, int64_t m, int64_t k, int64_t xs) {
  QuantizedX r;
  r.q.resize(static_cast<size_t>(m * k));
  r.scale.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    r.scale[static_cast<size_t>(i)] =
        internal::quantize_activation_row(x.data() + i * xs, k, r.q.data() + i * k);
  }
  return r;
}

class MatmulInt8Test : public ::testing::Test {
 protected:
  ThreadPool pool2_{2};
  ThreadPool pool3_{3};
};

TEST_F(MatmulInt8Test, PrintsTheIsaLevelsItExercises) {
  std::string line = "[ isa ]";
  for (IsaLevel level : levels_to_test()) line += " " + std::string(isa_level_name(level));
  std::printf("%s (int8: scalar; avx2/avx512 vpmaddubsw; avx512_vnni+ vpdpbusd)\n", line.c_str());
  EXPECT_EQ(levels_to_test().front(), IsaLevel::kScalar);
}

TEST_F(MatmulInt8Test, QuantizesWeightsPerRowWithRoundToNearest) {
  Random rng(7);
  const int64_t n = 21, k = 37, stride = 40;
  std::vector<float> w = rng.floats(static_cast<size_t>(n * stride), -3, 3);
  for (int64_t p = 0; p < k; ++p) w[static_cast<size_t>(5 * stride + p)] = 0.0f;  // zero row
  w[static_cast<size_t>(2 * stride + 3)] = 4.5f;  // this row's absmax
  // Exact ties (absmax 127: the multiplier is 1): round half to even, as nearbyint does.
  const float ties[] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.5f};
  for (size_t p = 0; p < std::size(ties); ++p) w[static_cast<size_t>(7 * stride) + p] = ties[p];
  auto packed = PackedInt8Matrix::quantize(MatrixView<float>{w.data(), n, k, stride});
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  EXPECT_EQ(packed->rows(), n);
  EXPECT_EQ(packed->cols(), k);
  EXPECT_FALSE(packed->is_gate_up());
  EXPECT_EQ(packed->scale(2), 4.5f / 127.0f);
  EXPECT_EQ(packed->value(2, 3), 127);
  EXPECT_EQ(packed->scale(5), 0.0f);
  EXPECT_EQ(packed->value(7, 3), 2);     // 2.5
  EXPECT_EQ(packed->value(7, 7), 126);   // 126.5
  EXPECT_EQ(packed->value(7, 8), -126);  // -126.5
  EXPECT_EQ(packed->value(7, 9), 4);     // 3.5
  // A row whose absmax is below 127 / FLT_MAX: 127 / absmax overflows, so the values are
  // divided instead (they were 0 * inf, NaN, cast to int: undefined).
  const std::vector<float> tiny = {3e-37f, 1e-39f, 0.0f, -3e-37f};
  auto tiny_packed = PackedInt8Matrix::quantize(MatrixView<float>{tiny.data(), 1, 4, 4});
  ASSERT_TRUE(tiny_packed.ok());
  EXPECT_EQ(tiny_packed->scale(0), 3e-37f / 127.0f);
  EXPECT_EQ(tiny_packed->value(0, 0), 127);
  EXPECT_EQ(tiny_packed->value(0, 1), 0);
  EXPECT_EQ(tiny_packed->value(0, 2), 0);
  EXPECT_EQ(tiny_packed->value(0, 3), -127);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    float absmax = 0;
    for (int64_t p = 0; p < k; ++p) absmax = std::max(absmax, std::fabs(w[j * stride + p]));
    const float s = packed->scale(j);
    EXPECT_EQ(s, absmax / 127.0f);
    packed->dequantized_row(j, row);
    for (int64_t p = 0; p < k; ++p) {
      const float v = w[static_cast<size_t>(j * stride + p)];
      const int q = packed->value(j, p);
      ASSERT_LE(std::abs(q), 127);
      EXPECT_EQ(q, absmax == 0 ? 0 : static_cast<int>(std::nearbyint(v * (127.0f / absmax))));
      // Round to nearest: within half a step (plus the rounding of 127 / absmax).
      EXPECT_LE(std::fabs(v - row[static_cast<size_t>(p)]), 0.5 * s * (1 + 0x1p-10))
          << "j=" << j << " p=" << p;
      EXPECT_EQ(row[static_cast<size_t>(p)], q * s);
    }
  }
}

TEST_F(MatmulInt8Test, ClippedRowQuantizationRoundsToNearestWithinTheClippedRange) {
  Random rng(11);
  std::vector<float> w = rng.floats(300, -2, 2);
  w[17] = 2.5f;  // the absmax
  std::vector<int8_t> a(w.size()), b(w.size());
  // Ratio 1 is the plain quantization.
  EXPECT_EQ(quantize_int8_row_clipped(w, 1.0f, a), quantize_int8_row(w, b));
  EXPECT_EQ(a, b);
  for (const float ratio : {0.8f, 0.5f, 1e-3f, 1e-6f}) {  // 1e-6: |w / scale| past 2^22
    const float scale = quantize_int8_row_clipped(w, ratio, a);
    const float clipped = 2.5f * ratio;
    EXPECT_EQ(scale, clipped / 127.0f) << ratio;
    for (size_t p = 0; p < w.size(); ++p) {
      // Against the library rounding of the same product, then the clip.
      const float expected = std::clamp(std::nearbyint(w[p] * (127.0f / clipped)), -127.0f, 127.0f);
      ASSERT_EQ(a[p], static_cast<int8_t>(expected)) << "ratio " << ratio << " p " << p;
    }
    EXPECT_EQ(a[17], 127);
  }
}

TEST_F(MatmulInt8Test, PacksGivenInt8WeightsAndTheGateUpLayout) {
  const int64_t rows = 19, k = 10;
  std::vector<int8_t> values(static_cast<size_t>(rows * k));
  std::vector<float> scales(static_cast<size_t>(rows));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int8_t>(i * 37 % 255 - 127);
  for (size_t j = 0; j < scales.size(); ++j) scales[j] = 0.01f * static_cast<float>(j);
  const Int8WeightsView view{{values.data(), rows, k, 0}, scales.data()};
  auto plain = PackedInt8Matrix::pack(view);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto gate_up = PackedInt8Matrix::pack_gate_up(view, view);
  ASSERT_TRUE(gate_up.ok()) << gate_up.status().to_string();
  EXPECT_TRUE(gate_up->is_gate_up());
  EXPECT_EQ(gate_up->rows(), 2 * rows);
  EXPECT_EQ(gate_up->outputs(), rows);
  for (int64_t j = 0; j < rows; ++j) {
    EXPECT_EQ(plain->scale(j), scales[static_cast<size_t>(j)]);
    EXPECT_EQ(gate_up->scale(j), scales[static_cast<size_t>(j)]);
    EXPECT_EQ(gate_up->scale(rows + j), scales[static_cast<size_t>(j)]);
    for (int64_t p = 0; p < k; ++p) {
      const int8_t v = values[static_cast<size_t>(j * k + p)];
      EXPECT_EQ(plain->value(j, p), v);
      EXPECT_EQ(gate_up->value(j, p), v);
      EXPECT_EQ(gate_up->value(rows + j, p), v);
    }
  }
  // 2 panels of 16 columns, k padded to 12: 2 * 3 groups * 64 bytes (+ scales, corrections).
  EXPECT_EQ(plain->panels(), 2);
  EXPECT_EQ(plain->bytes(), 2 * 3 * 64 + 32 * 8);
}

TEST_F(MatmulInt8Test, RejectsBadWeightsWithAClearError) {
  std::vector<int8_t> values = {1, 2, -128, 4};
  std::vector<float> scales = {1.0f, 1.0f};
  auto bad_value = PackedInt8Matrix::pack({{values.data(), 2, 2, 0}, scales.data()});
  ASSERT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.status().message().find("-128 at row 1, column 0"), std::string::npos)
      << bad_value.status().message();
  // Past the first vector of a row: the error still names the column.
  std::vector<int8_t> wide_row(2 * 80, int8_t{5});
  wide_row[80 + 77] = -128;
  auto bad_wide = PackedInt8Matrix::pack({{wide_row.data(), 2, 80, 0}, scales.data()});
  ASSERT_FALSE(bad_wide.ok());
  EXPECT_NE(bad_wide.status().message().find("-128 at row 1, column 77"), std::string::npos)
      << bad_wide.status().message();
  values[2] = 3;
  scales[1] = -1.0f;
  auto bad_scale = PackedInt8Matrix::pack({{values.data(), 2, 2, 0}, scales.data()});
  ASSERT_FALSE(bad_scale.ok());
  EXPECT_NE(bad_scale.status().message().find("scale of row 1"), std::string::npos);
  // The fused gate/up form: the error says which of its two inputs the row is in.
  std::vector<float> good_scales = {1.0f, 1.0f};
  values[1] = -128;
  const std::vector<int8_t> good = {1, 2, 3, 4};
  auto bad_up = PackedInt8Matrix::pack_gate_up({{good.data(), 2, 2, 0}, good_scales.data()},
                                               {{values.data(), 2, 2, 0}, good_scales.data()});
  ASSERT_FALSE(bad_up.ok());
  EXPECT_NE(bad_up.status().message().find("-128 at row 0 of up, column 1"), std::string::npos)
      << bad_up.status().message();
  auto bad_gate_scale = PackedInt8Matrix::pack_gate_up(
      {{good.data(), 2, 2, 0}, scales.data()}, {{good.data(), 2, 2, 0}, good_scales.data()});
  ASSERT_FALSE(bad_gate_scale.ok());
  EXPECT_NE(bad_gate_scale.status().message().find("scale of row 1 of gate"), std::string::npos)
      << bad_gate_scale.status().message();

  std::vector<float> w = {1, 2, std::numeric_limits<float>::quiet_NaN(), 4};
  auto nan = PackedInt8Matrix::quantize(MatrixView<float>{w.data(), 2, 2, 0});
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find("row 1, column 0 is not finite"), std::string::npos);
  std::vector<float> wide_w(2 * 80, 0.25f);
  wide_w[80 + 77] = -std::numeric_limits<float>::infinity();
  auto inf = PackedInt8Matrix::quantize(MatrixView<float>{wide_w.data(), 2, 80, 0});
  ASSERT_FALSE(inf.ok());
  EXPECT_NE(inf.status().message().find("row 1, column 77 is not finite"), std::string::npos)
      << inf.status().message();
  // The gate/up form says which of the two holds it.
  std::vector<float> fine = {1, 2, 3, 4};
  auto nan_up = PackedInt8Matrix::quantize_gate_up(MatrixView<float>{fine.data(), 2, 2, 0},
                                                   MatrixView<float>{w.data(), 2, 2, 0});
  ASSERT_FALSE(nan_up.ok());
  EXPECT_NE(nan_up.status().message().find("row 1, column 0 of up is not finite"),
            std::string::npos)
      << nan_up.status().message();
  auto nan_gate = PackedInt8Matrix::quantize_gate_up(MatrixView<float>{w.data(), 2, 2, 0},
                                                     MatrixView<float>{fine.data(), 2, 2, 0});
  ASSERT_FALSE(nan_gate.ok());
  EXPECT_NE(nan_gate.status().message().find("row 1, column 0 of gate is not finite"),
            std::string::npos)
      << nan_gate.status().message();
  auto stride = PackedInt8Matrix::quantize(MatrixView<float>{w.data(), 2, 2, 1});
  EXPECT_EQ(stride.status().code(), StatusCode::kInvalidArgument);
  auto null = PackedInt8Matrix::quantize(MatrixView<float>{nullptr, 2, 2, 0});
  EXPECT_EQ(null.status().code(), StatusCode::kInvalidArgument);
  auto wide = PackedInt8Matrix::quantize(MatrixView<float>{w.data(), 0, kMaxInt8Cols + 1, 0});
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("65537 columns"), std::string::npos);
  auto mismatch = PackedInt8Matrix::quantize_gate_up(MatrixView<float>{w.data(), 2, 2, 0},
                                                     MatrixView<float>{w.data(), 1, 2, 0});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("gate is [2, 2] but up is [1, 2]"), std::string::npos);
}

TEST_F(MatmulInt8Test, ActivationQuantizationIsTheSameBitsAtEveryLevel) {
  Random rng(11);
  for (int64_t k : {1, 3, 8, 15, 16, 17, 33, 100, 1000}) {
    // 1e-37: below 127 / FLT_MAX the inverse of the absmax overflows (each element is then
    // divided); its rows used to come out with positive values at -127 on the SIMD levels.
    // 4e-37: just above 127 / FLT_MAX (~3.73e-37), where every level must still multiply.
    for (float magnitude : {1e-37f, 4e-37f, 4.2e-37f, 1e-30f, 1e-3f, 1.0f, 3e4f}) {
      std::vector<float> x = rng.floats(static_cast<size_t>(k), -magnitude, magnitude);
      if (k > 2) x[1] = 0.0f;
      std::vector<int8_t> ref(static_cast<size_t>(k));
      float ref_scale;
      {
        ScopedIsaLevel isa(IsaLevel::kScalar);
        ref_scale = internal::quantize_activation_row(x.data(), k, ref.data());
      }
      float absmax = 0;
      for (float v : x) absmax = std::max(absmax, std::fabs(v));
      EXPECT_EQ(ref_scale, absmax / 127.0f);
      for (int64_t p = 0; p < k; ++p) {
        const size_t i = static_cast<size_t>(p);
        ASSERT_LE(std::abs(int{ref[i]}), 127);
        ASSERT_LE(std::fabs(x[i] - ref[i] * ref_scale), 0.5 * ref_scale * (1 + 0x1p-10));
      }
      for (IsaLevel level : levels_to_test()) {
        ScopedIsaLevel isa(level);
        std::vector<int8_t> q(static_cast<size_t>(k));
        EXPECT_EQ(internal::quantize_activation_row(x.data(), k, q.data()), ref_scale);
        EXPECT_EQ(q, ref) << level_label(level) << " k=" << k << " magnitude=" << magnitude;
      }
    }
  }
  // A row whose absmax lies between 127 / FLT_MAX and 127 / 3e38: the inverse is finite, so
  // the scalar reference multiplies; the SIMD levels divided (and rounded 8, 12, -14 as 7,
  // 11, -13).
  const std::vector<float> band = {4.0e-37f, 0x1.0138a8p-125f, 0x1.8a67fp-125f, -0x1.ceff94p-125f};
  const std::vector<int8_t> band_q = {127, 8, 12, -14};
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    std::vector<int8_t> got(band.size());
    internal::quantize_activation_row(band.data(), 4, got.data());
    EXPECT_EQ(got, band_q) << level_label(level);
  }
  // The smallest rows: signs and zeros kept at every level.
  const std::vector<float> tiny = {1e-37f, 0.0f, -1e-37f, 5e-38f};
  const std::vector<int8_t> tiny_q = {127, 0, -127, 64};
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    std::vector<int8_t> got(tiny.size());
    EXPECT_EQ(internal::quantize_activation_row(tiny.data(), 4, got.data()), 1e-37f / 127.0f);
    EXPECT_EQ(got, tiny_q) << level_label(level);
  }
  // Half steps round to even: max |x| = 127 makes the multiplier exactly 1, so each .5 is a
  // tie (half away from zero would give 1, 3, -1, -2, 127); ties in the vector body and tail.
  {
    std::vector<float> x(37, 0.0f);
    x[0] = 127.0f;
    const std::vector<float> ties = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f};
    const std::vector<int> expected = {0, 2, 2, 0, -2, -2, 126, -126};
    const std::vector<size_t> at = {1, 2, 3, 9, 17, 30, 33, 36};
    for (size_t t = 0; t < ties.size(); ++t) x[at[t]] = ties[t];
    for (IsaLevel level : levels_to_test()) {
      ScopedIsaLevel isa(level);
      std::vector<int8_t> got(x.size());
      EXPECT_EQ(internal::quantize_activation_row(x.data(), 37, got.data()), 1.0f);
      for (size_t t = 0; t < ties.size(); ++t) {
        EXPECT_EQ(got[at[t]], expected[t]) << level_label(level) << ": " << ties[t];
      }
    }
  }
  // An all-zero row: scale 0, values 0 (no division by zero).
  std::vector<float> zeros(20, 0.0f);
  std::vector<int8_t> q(20, 1);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    EXPECT_EQ(internal::quantize_activation_row(zeros.data(), 20, q.data()), 0.0f);
    EXPECT_EQ(q, std::vector<int8_t>(20, 0)) << level_label(level);
  }
}

// One case at one level: exact int32 sums, then y against the references.
void check_case(IsaLevel level, const Shape& s, bool strided, bool accumulate, ThreadPool* pool,
                uint64_t seed, std::vector<float>* y_out) {
  SCOPED_TRACE(level_label(level) + " " + describe(s) + (strided ? " strided" : "") +
               (accumulate ? " accumulate" : "") +
               " threads=" + std::to_string(pool ? pool->num_threads() : 1));
  Random rng(seed);
  const int64_t xs = strided ? s.k + 3 : s.k, ws = strided ? s.k + 5 : s.k,
                ys = strided ? s.n + 2 : s.n;
  const PackedInt8Matrix w = random_weights(rng, s.n, s.k, std::max<int64_t>(ws, 1));
  std::vector<float> x = rng.floats(static_cast<size_t>(s.m * xs + 1), -2, 2);
  std::vector<float> y = rng.floats(static_cast<size_t>(s.m * ys + 2));
  const std::vector<float> y_before = y;
  float* y0 = y.data() + 1;

  MatmulInt8Args args;
  args.x = x.data();
  args.x_stride = strided ? xs : 0;
  args.w = &w;
  args.y = y0;
  args.y_stride = strided ? ys : 0;
  args.m = s.m;
  args.accumulate = accumulate;

  ScopedIsaLevel isa(level);
  const QuantizedX xq = quantize_x(x, s.m, s.k, xs);
  std::vector<int32_t> acc(static_cast<size_t>(s.m * ys + 1), -7);
  internal::matmul_int8_accumulators(args, acc.data(), ys, pool);
  matmul_int8(args, pool);

  // The packed weights read back once through the accessors (the layout under test).
  std::vector<int8_t> wq(static_cast<size_t>(s.n * s.k));
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t p = 0; p < s.k; ++p) wq[static_cast<size_t>(j * s.k + p)] = w.value(j, p);
  }
  for (int64_t i = 0; i < s.m; ++i) {
    const double sx = xq.scale[static_cast<size_t>(i)];
    for (int64_t j = 0; j < s.n; ++j) {
      int64_t ref_acc = 0;
      double exact = 0, bound = 0;
      const double sw = w.scale(j);
      for (int64_t p = 0; p < s.k; ++p) {
        const int q = xq.q[static_cast<size_t>(i * s.k + p)];
        const int wv = wq[static_cast<size_t>(j * s.k + p)];
        ref_acc += int64_t{q} * wv;
        const double xv = x[static_cast<size_t>(i * xs + p)];
        const double wv_hat = wv * sw;
        exact += xv * wv_hat;
        // |x - x^| |w^| + |x| |w - w^|: half a quantization step each (see matmul_int8.h),
        // with a margin for the fp32 rounding of 127 / absmax.
        bound += 0.5 * (1 + 0x1p-10) * (sx * std::fabs(wv_hat) + std::fabs(xv) * sw);
      }
      ASSERT_EQ(acc[static_cast<size_t>(i * ys + j)], ref_acc)
          << "int32 sum at i=" << i << " j=" << j;
      const double base = accumulate ? y_before[static_cast<size_t>(1 + i * ys + j)] : 0.0;
      const double got = y0[i * ys + j];
      // float(acc), sx * sw and their product: three fp32 roundings; one more for the add.
      const double ref = static_cast<double>(ref_acc) * sx * sw;
      const double tol = 4 * kUnitRoundoff * (std::fabs(ref) + std::fabs(base)) + 1e-37;
      ASSERT_NEAR(got, base + ref, tol) << "vs quantized operands at i=" << i << " j=" << j;
      // Against the unquantized x (and the dequantized weights: the weight side of the
      // bound is in `bound` too, so this also holds for the original weights).
      ASSERT_NEAR(got, base + exact, tol + bound) << "vs unquantized x at i=" << i << " j=" << j;
    }
    for (int64_t j = s.n; j < ys && i + 1 < s.m; ++j) {
      ASSERT_EQ(y0[i * ys + j], y_before[static_cast<size_t>(1 + i * ys + j)]);
    }
  }
  EXPECT_EQ(y.front(), y_before.front());
  EXPECT_EQ(y.back(), y_before.back());
  if (y_out != nullptr) *y_out = y;
}

TEST_F(MatmulInt8Test, MatchesReferencesAtEveryLevelAndLevelsAgreeBitwise) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 3; ++variant) {
      ++seed;
      const bool strided = variant > 0, accumulate = variant == 1;
      ThreadPool* pool = variant == 0 ? nullptr : variant == 1 ? &pool2_ : &pool3_;
      std::vector<float> scalar_y;
      for (IsaLevel level : levels_to_test()) {
        std::vector<float> y;
        check_case(level, s, strided, accumulate, pool, seed, &y);
        if (HasFatalFailure()) return;
        if (level == IsaLevel::kScalar) {
          scalar_y = y;
        } else {
          ASSERT_EQ(y, scalar_y) << level_label(level) << " differs from scalar, " << describe(s);
        }
      }
    }
  }
}

TEST_F(MatmulInt8Test, AgainstTheOriginalBf16Weights) {
  // quantize() from bf16: the same bound against the unquantized bf16 weights.
  Random rng(5);
  const int64_t m = 3, n = 40, k = 130;
  std::vector<bf16> w = rng.bf16s(static_cast<size_t>(n * k));
  auto packed = PackedInt8Matrix::quantize(MatrixView<bf16>{w.data(), n, k, 0});
  ASSERT_TRUE(packed.ok());
  std::vector<float> x = rng.floats(static_cast<size_t>(m * k));
  std::vector<float> y(static_cast<size_t>(m * n));
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    matmul_int8({x.data(), 0, &*packed, y.data(), 0, m, false}, nullptr);
    const QuantizedX xq = quantize_x(x, m, k, k);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, bound = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double xv = x[static_cast<size_t>(i * k + p)];
          const double wv = bf16_to_float(w[static_cast<size_t>(j * k + p)]);
          exact += xv * wv;
          bound += 0.5 * (1 + 0x1p-10) *
                   (xq.scale[static_cast<size_t>(i)] * std::fabs(packed->value(j, p)) *
                        packed->scale(j) +
                    std::fabs(xv) * packed->scale(j));
        }
        const double got = y[static_cast<size_t>(i * n + j)];
        ASSERT_NEAR(got, exact, bound + 4 * kUnitRoundoff * std::fabs(got))
            << level_label(level) << " i=" << i << " j=" << j;
      }
    }
  }
}

// Runs matmul_int8 on rows [0, m) of x and returns y [m, n].
std::vector<float> run(const PackedInt8Matrix& w, const float* x, int64_t m, ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(m * w.rows()));
  matmul_int8({x, 0, &w, y.data(), 0, m, false}, pool);
  return y;
}

TEST_F(MatmulInt8Test, BatchInvariantAcrossRowsThreadsAndPaths) {
  Random rng(3);
  const int64_t m = 29, n = 150, k = 520;
  const PackedInt8Matrix w = random_weights(rng, n, k, k);
  const std::vector<float> x = rng.floats(static_cast<size_t>(m * k));
  for (IsaLevel level : levels_to_test()) {
    SCOPED_TRACE(level_label(level));
    ScopedIsaLevel isa(level);
    const std::vector<float> full = run(w, x.data(), m, &pool2_);
    EXPECT_EQ(run(w, x.data(), m, nullptr), full) << "1 vs 2 threads";
    EXPECT_EQ(run(w, x.data(), m, &pool3_), full) << "3 vs 2 threads";
    for (int64_t i : {int64_t{0}, int64_t{5}, m - 1}) {
      const std::vector<float> alone = run(w, x.data() + i * k, 1, &pool2_);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), full.begin() + i * n)) << "row " << i;
    }
    // Sub-batches of every size up to 14: 1 to 3 register steps of 6 rows (2 on AVX2).
    for (int64_t rows = 1; rows <= 14; ++rows) {
      const std::vector<float> part = run(w, x.data() + 3 * k, rows, &pool3_);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin() + 3 * n)) << rows << " rows";
    }
  }
}

TEST_F(MatmulInt8Test, GroupedEqualsEachProblemAlone) {
  Random rng(9);
  // {2, 16, 0}: k = 0 costs nothing to compute but must still write its zeros (it was
  // skipped when split over threads). y starts non-zero so that a skipped problem shows.
  const Shape shapes[] = {{1, 40, 64}, {0, 16, 64},   {5, 33, 100},
                          {2, 7, 31},  {12, 90, 200}, {2, 16, 0}};
  std::vector<PackedInt8Matrix> ws;
  std::vector<std::vector<float>> xs, ys;
  for (const Shape& s : shapes) {
    ws.push_back(random_weights(rng, s.n, s.k, s.k));
    xs.push_back(rng.floats(static_cast<size_t>(s.m * s.k)));
    ys.emplace_back(static_cast<size_t>(s.m * s.n), 7.0f);
  }
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    std::vector<MatmulInt8Args> problems;
    for (size_t e = 0; e < ws.size(); ++e) {
      problems.push_back({xs[e].data(), 0, &ws[e], ys[e].data(), 0, shapes[e].m, false});
    }
    grouped_matmul_int8(problems, &pool3_);
    for (size_t e = 0; e < ws.size(); ++e) {
      EXPECT_EQ(ys[e], run(ws[e], xs[e].data(), shapes[e].m, nullptr))
          << level_label(level) << " problem " << e;
    }
  }
}

// MoE experts with a few tokens each: no problem alone is large enough for the threads, all
// of them together are (the activations of every problem are quantized in one parallel pass).
TEST_F(MatmulInt8Test, ManySmallGroupedProblemsOnThreadsEqualEachAlone) {
  Random rng(21);
  const int64_t n = 48, k = 512, count = 24;
  std::vector<PackedInt8Matrix> ws;
  std::vector<std::vector<float>> xs;
  for (int64_t e = 0; e < count; ++e) {
    ws.push_back(random_weights(rng, n, k, k));
    xs.push_back(rng.floats(static_cast<size_t>((1 + e % 12) * k)));
  }
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    std::vector<std::vector<float>> ys(static_cast<size_t>(count));
    std::vector<MatmulInt8Args> problems;
    int64_t elements = 0;
    for (int64_t e = 0; e < count; ++e) {
      const int64_t m = 1 + e % 12;
      ys[e].assign(static_cast<size_t>(m * n), 0.0f);
      problems.push_back({xs[e].data(), 0, &ws[e], ys[e].data(), 0, m, false});
      elements += m * k;
    }
    ASSERT_GE(elements, 64 * 1024);  // above the threshold of a parallel quantization
    grouped_matmul_int8(problems, &pool2_);
    for (int64_t e = 0; e < count; ++e) {
      EXPECT_EQ(ys[e], run(ws[e], xs[e].data(), 1 + e % 12, nullptr))
          << level_label(level) << " problem " << e;
    }
  }
}

TEST_F(MatmulInt8Test, FusedGateUpSiluEqualsUnfusedBitwise) {
  Random rng(13);
  struct Expert {
    int64_t m, inter, k;
  };
  const Expert experts[] = {{1, 24, 64}, {3, 16, 33}, {0, 8, 8}, {9, 50, 130}, {4, 1, 7}};
  std::vector<PackedInt8Matrix> fused, gates, ups;
  std::vector<std::vector<float>> xs;
  for (const Expert& e : experts) {
    const std::vector<float> g = rng.floats(static_cast<size_t>(e.inter * e.k), -2, 2);
    const std::vector<float> u = rng.floats(static_cast<size_t>(e.inter * e.k));
    const MatrixView<float> gv{g.data(), e.inter, e.k, 0}, uv{u.data(), e.inter, e.k, 0};
    fused.push_back(std::move(PackedInt8Matrix::quantize_gate_up(gv, uv)).value());
    gates.push_back(std::move(PackedInt8Matrix::quantize(gv)).value());
    ups.push_back(std::move(PackedInt8Matrix::quantize(uv)).value());
    xs.push_back(rng.floats(static_cast<size_t>(e.m * e.k), -3, 3));
  }
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    std::vector<std::vector<float>> outs;
    std::vector<GateUpInt8Args> problems;
    for (size_t i = 0; i < fused.size(); ++i) {
      outs.emplace_back(static_cast<size_t>(experts[i].m * experts[i].inter), -1.0f);
      problems.push_back({xs[i].data(), 0, &fused[i], outs[i].data(), 0, experts[i].m});
    }
    grouped_gate_up_silu_int8(problems, &pool2_);
    for (size_t i = 0; i < fused.size(); ++i) {
      SCOPED_TRACE(level_label(level) + " expert " + std::to_string(i));
      const Expert& e = experts[i];
      const std::vector<float> g = run(gates[i], xs[i].data(), e.m, nullptr);
      const std::vector<float> u = run(ups[i], xs[i].data(), e.m, nullptr);
      std::vector<float> expected(g.size());
      silu_mul(g.data(), u.data(), expected.data(), static_cast<int64_t>(g.size()));
      EXPECT_EQ(outs[i], expected);
      // Alone and on one thread: the same bits.
      std::vector<float> alone(outs[i].size());
      gate_up_silu_int8({xs[i].data(), 0, &fused[i], alone.data(), 0, e.m}, nullptr);
      EXPECT_EQ(alone, outs[i]);
    }
  }
}

TEST_F(MatmulInt8Test, ZeroRowsOfXGiveZeros) {
  Random rng(17);
  const PackedInt8Matrix w = random_weights(rng, 20, 40, 40);
  std::vector<float> x(80, 0.0f);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    EXPECT_EQ(run(w, x.data(), 2, nullptr), std::vector<float>(40, 0.0f)) << level_label(level);
  }
}

// A damaged input (a NaN weight upstream, an overflow) must not come out as plausible
// numbers: a row holding NaN or inf gives a NaN row of y, as a float product does, at every
// level, in the vector body and the tail; the other rows keep their bits.
TEST_F(MatmulInt8Test, NonFiniteRowsOfXGiveNaNRows) {
  Random rng(19);
  const int64_t n = 21, k = 37;
  const PackedInt8Matrix w = random_weights(rng, n, k, k);
  std::vector<float> x = rng.floats(static_cast<size_t>(4 * k));
  x[static_cast<size_t>(1 * k + 3)] = std::numeric_limits<float>::quiet_NaN();   // vector body
  x[static_cast<size_t>(2 * k + 36)] = -std::numeric_limits<float>::infinity();  // tail
  for (IsaLevel level : levels_to_test()) {
    SCOPED_TRACE(level_label(level));
    ScopedIsaLevel isa(level);
    const std::vector<float> y = run(w, x.data(), 4, nullptr);
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(1 * n + j)])) << j;
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(2 * n + j)])) << j;
    }
    const std::vector<float> first = run(w, x.data(), 1, nullptr);
    const std::vector<float> last = run(w, x.data() + 3 * k, 1, nullptr);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), y.begin()));
    EXPECT_TRUE(std::equal(last.begin(), last.end(), y.begin() + 3 * n));
    std::vector<int8_t> q(static_cast<size_t>(k));
    EXPECT_TRUE(std::isnan(internal::quantize_activation_row(x.data() + k, k, q.data())));
    EXPECT_EQ(q, std::vector<int8_t>(static_cast<size_t>(k), 0));
  }
}

}  // namespace
}  // namespace peerserve::kernels
