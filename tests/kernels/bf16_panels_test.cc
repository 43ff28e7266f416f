// Bf16Panels (packed bf16 keys and values built at run time, products over leading rows and
// columns) against the definition evaluated in double, at every ISA level this CPU runs,
// with the packed product's error bound; plus row invariance and untouched padding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/bf16_panels.h"
#include "tests/kernels/kernel_test_support.h"

namespace peerserve::kernels {
namespace {

using testing::level_label;
using testing::levels_to_test;
using testing::Random;

constexpr float kUntouched = -12345.0f;

double rounded(float v) {
  return static_cast<double>(bf16_to_float(float_to_bf16(v)));
}

// x rounded to bf16, with the zero the contract asks for past an odd k_limit.
std::vector<bf16> bf16_rows(const std::vector<float>& x, int64_t m, int64_t k, int64_t stride) {
  std::vector<bf16> out(static_cast<size_t>(m * stride), bf16{0});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) out[i * stride + p] = float_to_bf16(x[i * k + p]);
  }
  return out;
}

// y[i, j] against sum over p < k_limit of bf16(x[i, p]) * bf16(w(j, p)) (+ y0).
void expect_product(const std::vector<float>& x, int64_t m, int64_t k_limit,
                    const std::vector<float>& w_rows, int64_t cols, int64_t n_limit,
                    const std::vector<float>& y, int64_t y_stride, const std::vector<float>* y0) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < y_stride; ++j) {
      const float got = y[static_cast<size_t>(i * y_stride + j)];
      if (j >= n_limit) {
        ASSERT_EQ(got, y0 ? (*y0)[i * y_stride + j] : kUntouched)
            << "column " << j << " past n_limit written, row " << i;
        continue;
      }
      double exact = y0 ? (*y0)[i * y_stride + j] : 0.0;
      double magnitude = std::fabs(exact);
      for (int64_t p = 0; p < k_limit; ++p) {
        const double term = rounded(x[i * k_limit + p]) * rounded(w_rows[j * cols + p]);
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(k_limit + 2) * 0x1p-24 * magnitude;
      ASSERT_LE(std::fabs(got - exact), bound) << "row " << i << " column " << j;
    }
  }
}

struct Case {
  int64_t rows, cols, m, n_limit, k_limit;
};

// Shapes of the prefill attention (keys 192 wide, values over a context) and edges: odd
// columns, a partial last panel, limits at 1 and at the full size.
constexpr Case kCases[] = {{1, 1, 1, 1, 1},
                           {16, 2, 3, 16, 2},
                           {17, 96, 32, 17, 96},
                           {100, 192, 7, 37, 192},
                           {64, 513, 32, 64, 513},
                           {64, 513, 5, 50, 300},
                           {33, 31, 6, 33, 31},
                           {128, 64, 32, 97, 63},
                           // The decode attention's: a query's heads against 576-wide keys.
                           {16, 576, 16, 16, 576},
                           {20, 576, 7, 20, 576},
                           {40, 64, 5, 40, 64}};

TEST(Bf16Panels, RowFilledProductsEqualTheDefinitionWithinTheSumBound) {
  std::string levels = "[ isa ]";
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    levels += " " + std::string(isa_level_name(level));
    Random rng(23);
    for (const Case& c : kCases) {
      SCOPED_TRACE(level_label(level) + " rows=" + std::to_string(c.rows) +
                   " cols=" + std::to_string(c.cols) + " m=" + std::to_string(c.m) + " n_limit=" +
                   std::to_string(c.n_limit) + " k_limit=" + std::to_string(c.k_limit));
      // Filled in two column segments (as keys are: k_nope, then k_pe), each from its own
      // strided source.
      const int64_t split = c.cols >= 2 ? (c.cols / 2) / 2 * 2 : 0;
      const std::vector<float> w = rng.floats(static_cast<size_t>(c.rows * c.cols), -2, 2);
      const int64_t stride_a = split + 3, stride_b = c.cols - split + 5;
      std::vector<float> a(static_cast<size_t>(c.rows * stride_a)),
          b(static_cast<size_t>(c.rows * stride_b));
      for (int64_t j = 0; j < c.rows; ++j) {
        for (int64_t p = 0; p < c.cols; ++p) {
          if (p < split) {
            a[j * stride_a + p] = w[j * c.cols + p];
          } else {
            b[j * stride_b + p - split] = w[j * c.cols + p];
          }
        }
      }
      Bf16Panels panels;
      panels.reset(c.rows, c.cols);
      if (split > 0) panels.fill_rows(a.data(), stride_a, 0, split);
      panels.fill_rows(b.data(), stride_b, split, c.cols - split);

      const std::vector<float> x = rng.floats(static_cast<size_t>(c.m * c.k_limit), -3, 3);
      const int64_t x_stride = (c.k_limit + 1) / 2 * 2 + 4;
      const std::vector<bf16> xb = bf16_rows(x, c.m, c.k_limit, x_stride);
      const int64_t y_stride = c.n_limit + 3;
      std::vector<float> y(static_cast<size_t>(c.m * y_stride), kUntouched);
      panels.multiply(xb.data(), x_stride, c.m, c.n_limit, c.k_limit, y.data(), y_stride, false);
      expect_product(x, c.m, c.k_limit, w, c.cols, c.n_limit, y, y_stride, nullptr);

      // Accumulate adds the product to what y holds.
      const std::vector<float> y0 = rng.floats(y.size(), -5, 5);
      y = y0;
      panels.multiply(xb.data(), x_stride, c.m, c.n_limit, c.k_limit, y.data(), y_stride, true);
      expect_product(x, c.m, c.k_limit, w, c.cols, c.n_limit, y, y_stride, &y0);
    }
  }
  std::printf("%s (bf16 panels: the packed bf16 product at each level)\n", levels.c_str());
}

TEST(Bf16Panels, TransposedFillsEqualTheDefinitionWithinTheSumBound) {
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    Random rng(29);
    for (const Case& c : kCases) {
      SCOPED_TRACE(level_label(level) + " rows=" + std::to_string(c.rows) +
                   " cols=" + std::to_string(c.cols));
      // The source is [cols, rows] (values: a key per row, v columns), read transposed.
      const int64_t stride = c.rows + 7;
      const std::vector<float> src = rng.floats(static_cast<size_t>(c.cols * stride), -2, 2);
      std::vector<float> w(static_cast<size_t>(c.rows * c.cols));
      for (int64_t j = 0; j < c.rows; ++j) {
        for (int64_t p = 0; p < c.cols; ++p) w[j * c.cols + p] = src[p * stride + j];
      }
      Bf16Panels panels;
      panels.reset(c.rows, c.cols);
      panels.fill_transposed(src.data(), stride);
      const std::vector<float> x = rng.floats(static_cast<size_t>(c.m * c.k_limit), -1, 1);
      const int64_t x_stride = (c.k_limit + 1) / 2 * 2;
      const std::vector<bf16> xb = bf16_rows(x, c.m, c.k_limit, x_stride);
      std::vector<float> y(static_cast<size_t>(c.m * c.n_limit), kUntouched);
      panels.multiply(xb.data(), x_stride, c.m, c.n_limit, c.k_limit, y.data(), c.n_limit, false);
      expect_product(x, c.m, c.k_limit, w, c.cols, c.n_limit, y, c.n_limit, nullptr);
    }
  }
}

// The attention relies on it: a query's scores and sums are the same whichever tile holds it
// (tiles see different numbers of keys and queries), so that chunked prefill and prefix-cache
// hits give the same bits as one prefill. Also checks that a smaller reset reuses the panels.
TEST(Bf16Panels, ARowsResultIsBitwiseTheSameWhateverTheOtherRowsAndLimits) {
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    Random rng(31);
    const int64_t rows = 80, cols = 160, m = 13;
    const std::vector<float> w = rng.floats(static_cast<size_t>(rows * cols));
    const std::vector<float> x = rng.floats(static_cast<size_t>(m * cols));
    const std::vector<bf16> xb = bf16_rows(x, m, cols, cols);
    Bf16Panels panels;
    panels.reset(200, 400);  // larger first: the storage is kept for the smaller matrix
    panels.reset(rows, cols);
    panels.fill_rows(w.data(), cols, 0, cols);
    std::vector<float> all(static_cast<size_t>(m * rows));
    panels.multiply(xb.data(), cols, m, rows, cols, all.data(), rows, false);
    for (int64_t i = 0; i < m; ++i) {
      for (const int64_t n_limit : {int64_t{1}, int64_t{17}, rows}) {
        std::vector<float> one(static_cast<size_t>(n_limit));
        panels.multiply(xb.data() + i * cols, cols, 1, n_limit, cols, one.data(), n_limit, false);
        for (int64_t j = 0; j < n_limit; ++j) {
          ASSERT_EQ(one[j], all[i * rows + j]) << "row " << i << " column " << j;
        }
      }
    }
  }
}

// A context past the row blocks' byte budget (x rows over 256 KiB: k_limit > 131072 bf16):
// the prefill attention's values times probabilities at such a position used to never end.
TEST(Bf16Panels, AContextWiderThanARowBlockStillEndsAndIsRight) {
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    Random rng(37);
    const int64_t rows = 16, cols = 140002;
    const std::vector<float> w = rng.floats(static_cast<size_t>(rows * cols));
    Bf16Panels panels;
    panels.reset(rows, cols);
    panels.fill_rows(w.data(), cols, 0, cols);
    for (const int64_t m : {int64_t{1}, int64_t{4}, int64_t{7}}) {
      SCOPED_TRACE("m=" + std::to_string(m));
      const int64_t k_limit = cols - 1;
      const std::vector<float> x = rng.floats(static_cast<size_t>(m * k_limit));
      const std::vector<bf16> xb = bf16_rows(x, m, k_limit, cols);
      std::vector<float> y(static_cast<size_t>(m * rows), kUntouched);
      testing::run_with_deadline(
          level_label(level) + " m=" + std::to_string(m), std::chrono::seconds(120),
          [&] { panels.multiply(xb.data(), cols, m, rows, k_limit, y.data(), rows, false); });
      expect_product(x, m, k_limit, w, cols, rows, y, rows, nullptr);
    }
  }
}

}  // namespace
}  // namespace peerserve::kernels
