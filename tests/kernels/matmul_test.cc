// matmul_bf16 / matmul_f32 / grouped_matmul_bf16 against an independent double-precision
// reference on random data, at every ISA level this CPU has; and batch invariance (bitwise).
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "kernel_test_support.h"

namespace peerserve::kernels {
namespace {

using testing::kUnitRoundoff;
using testing::level_label;
using testing::levels_to_test;
using testing::Random;
using testing::summation_chain;

double widen(float v) {
  return v;
}
double widen(bf16 v) {
  return bf16_to_float(v);
}

struct Shape {
  int64_t m, n, k;
};

// Odd sizes on purpose: k tails for 8/16/32-element steps, n tails for every register
// block, m = 1 (the decode path), m = 0, k = 0, and sizes crossing the row blocking.
const Shape kShapes[] = {
    {1, 1, 1},   {1, 17, 33},   {0, 5, 5},    {3, 7, 0},     {5, 37, 100},  {2, 3, 16},
    {7, 6, 32},  {9, 13, 47},   {1, 130, 31}, {4, 64, 257},  {13, 50, 129}, {1, 9, 1000},
    {6, 25, 64}, {35, 9, 4096}, {3, 1, 5},    {1, 24, 2048}, {17, 31, 15},
};

// Runs one randomized case and checks y against the reference:
//   precision kFp32 (and f32 weights): reference = sum of exact products of the inputs;
//   kBf16: reference = the same with x rounded to bf16 first, and also (looser) without.
template <typename Weight>
void check_case(IsaLevel level, const Shape& s, ActivationPrecision precision, bool strided,
                bool accumulate, ThreadPool* pool, uint64_t seed) {
  SCOPED_TRACE(level_label(level) + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
               " k=" + std::to_string(s.k) + (strided ? " strided" : "") +
               (accumulate ? " accumulate" : "") +
               (precision == ActivationPrecision::kBf16 ? " bf16-activations" : "") +
               " threads=" + std::to_string(pool ? pool->num_threads() : 1));
  Random rng(seed);
  const int64_t xs = strided ? s.k + 3 : s.k, ws = strided ? s.k + 5 : s.k,
                ys = strided ? s.n + 2 : s.n;
  // One extra element before and after each buffer catches stray writes (y) and lets the
  // test give w an odd (2-byte aligned) start.
  std::vector<float> x = rng.floats(static_cast<size_t>(s.m * xs + 1));
  std::vector<Weight> w_storage(static_cast<size_t>(s.n * ws + 2));
  for (Weight& v : w_storage) {
    if constexpr (std::is_same_v<Weight, bf16>) {
      v = float_to_bf16(rng.uniform(-1, 1));
    } else {
      v = rng.uniform(-1, 1);
    }
  }
  const Weight* w = w_storage.data() + 1;
  std::vector<float> y = rng.floats(static_cast<size_t>(s.m * ys + 2));
  const std::vector<float> y_before = y;
  float* y0 = y.data() + 1;

  MatmulArgs<Weight> args;
  args.x = x.data();
  args.x_stride = strided ? xs : 0;
  args.w = w;
  args.w_stride = strided ? ws : 0;
  args.y = y0;
  args.y_stride = strided ? ys : 0;
  args.m = s.m;
  args.n = s.n;
  args.k = s.k;
  args.accumulate = accumulate;
  {
    ScopedIsaLevel isa(level);
    if constexpr (std::is_same_v<Weight, bf16>) {
      matmul_bf16(args, precision, pool);
    } else {
      matmul_f32(args, pool);
    }
  }

  const bool bf16_x = precision == ActivationPrecision::kBf16;
  const double chain = summation_chain(level, s.k);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double ref = 0, ref_unrounded = 0, magnitude = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const float xv = x[static_cast<size_t>(i * xs + p)];
        const double xr = bf16_x ? bf16_to_float(float_to_bf16(xv)) : xv;
        const double wv = widen(w[j * ws + p]);
        ref += xr * wv;
        ref_unrounded += static_cast<double>(xv) * wv;
        magnitude += std::fabs(xr * wv);
      }
      const double base = accumulate ? y_before[static_cast<size_t>(1 + i * ys + j)] : 0.0;
      const double got = y0[i * ys + j];
      // Summation error bound (see summation_chain); the +1e-30 keeps k = 0 exact.
      const double tol = chain * kUnitRoundoff * (magnitude + std::fabs(base)) + 1e-30;
      ASSERT_NEAR(got, base + ref, tol) << "at i=" << i << " j=" << j;
      if (bf16_x) {
        // Rounding x to bf16 (8 significant bits, unit roundoff 2^-8) changes each product
        // by at most 2^-8 relative.
        ASSERT_NEAR(got, base + ref_unrounded, tol + 0x1p-8 * magnitude * 1.01)
            << "vs unrounded x at i=" << i << " j=" << j;
      }
    }
    // Padding columns between rows stay untouched.
    for (int64_t j = s.n; j < ys && i + 1 < s.m; ++j) {
      ASSERT_EQ(y0[i * ys + j], y_before[static_cast<size_t>(1 + i * ys + j)]);
    }
  }
  EXPECT_EQ(y.front(), y_before.front());
  EXPECT_EQ(y.back(), y_before.back());
}

class MatmulTest : public ::testing::Test {
 protected:
  ThreadPool pool2_{2};
  ThreadPool pool3_{3};
};

// Rows wider than a row block's byte budget (256 KiB: k > 65536 fp32, k > 131072 bf16).
// The block must still take a register step of rows; it used to round down to zero rows,
// and the loop over blocks never advanced.
TEST_F(MatmulTest, RowsWiderThanARowBlockStillEndAndAreRight) {
  const Shape shapes[] = {{4, 3, 70001}, {7, 2, 140001}, {1, 2, 140001}};
  uint64_t seed = 500;
  for (IsaLevel level : levels_to_test()) {
    for (const Shape& s : shapes) {
      testing::run_with_deadline(
          level_label(level) + " m=" + std::to_string(s.m) + " k=" + std::to_string(s.k),
          std::chrono::seconds(120), [&] {
            check_case<bf16>(level, s, ActivationPrecision::kBf16, false, false, nullptr, ++seed);
            check_case<bf16>(level, s, ActivationPrecision::kFp32, true, true, &pool2_, ++seed);
            check_case<float>(level, s, ActivationPrecision::kFp32, false, false, nullptr, ++seed);
          });
      if (HasFailure()) return;
    }
  }
}

TEST_F(MatmulTest, Bf16WeightsMatchReferenceAtEveryLevel) {
  uint64_t seed = 1;
  for (IsaLevel level : levels_to_test()) {
    for (const Shape& s : kShapes) {
      for (ActivationPrecision precision :
           {ActivationPrecision::kFp32, ActivationPrecision::kBf16}) {
        check_case<bf16>(level, s, precision, false, false, nullptr, ++seed);
        check_case<bf16>(level, s, precision, true, true, &pool2_, ++seed);
        check_case<bf16>(level, s, precision, true, false, &pool3_, ++seed);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(MatmulTest, F32WeightsMatchReferenceAtEveryLevel) {
  uint64_t seed = 1000;
  for (IsaLevel level : levels_to_test()) {
    for (const Shape& s : kShapes) {
      check_case<float>(level, s, ActivationPrecision::kFp32, false, false, nullptr, ++seed);
      check_case<float>(level, s, ActivationPrecision::kFp32, true, true, &pool2_, ++seed);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- batch invariance ----

struct Problem {
  int64_t m, n, k;
  std::vector<float> x;
  std::vector<bf16> w;
};

Problem make_problem(int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Random rng(seed);
  return Problem{m, n, k, rng.floats(static_cast<size_t>(m * k)),
                 rng.bf16s(static_cast<size_t>(n * k))};
}

MatmulBf16Args rows_of(const Problem& p, int64_t row_begin, int64_t rows, float* y) {
  MatmulBf16Args a;
  a.x = p.x.data() + row_begin * p.k;
  a.w = p.w.data();
  a.y = y;
  a.m = rows;
  a.n = p.n;
  a.k = p.k;
  return a;
}

bool bitwise_equal(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST_F(MatmulTest, RowsAreBitwiseIndependentOfBatchAndThreads) {
  // k = 2048 crosses the row blocking of every tile function; m = 70 is not a multiple of
  // any register block.
  for (const Shape s : {Shape{70, 21, 2048}, Shape{11, 70, 333}}) {
    const Problem p = make_problem(s.m, s.n, s.k, 42 + s.k);
    for (IsaLevel level : levels_to_test()) {
      ScopedIsaLevel isa(level);
      for (ActivationPrecision precision :
           {ActivationPrecision::kFp32, ActivationPrecision::kBf16}) {
        SCOPED_TRACE(level_label(level) + " k=" + std::to_string(s.k) +
                     (precision == ActivationPrecision::kBf16 ? " bf16" : " fp32"));
        std::vector<float> full(static_cast<size_t>(s.m * s.n));
        matmul_bf16(rows_of(p, 0, s.m, full.data()), precision, &pool2_);
        // Each row alone, single-threaded.
        std::vector<float> one(static_cast<size_t>(s.n));
        for (int64_t i = 0; i < s.m; ++i) {
          matmul_bf16(rows_of(p, i, 1, one.data()), precision, nullptr);
          ASSERT_TRUE(bitwise_equal(one.data(), full.data() + i * s.n, s.n)) << "row " << i;
        }
        // Uneven sub-batches on three threads.
        for (const auto& [begin, rows] : {std::pair<int64_t, int64_t>{1, 5}, {6, 3}, {2, 9}}) {
          std::vector<float> part(static_cast<size_t>(rows * s.n));
          matmul_bf16(rows_of(p, begin, rows, part.data()), precision, &pool3_);
          ASSERT_TRUE(bitwise_equal(part.data(), full.data() + begin * s.n, rows * s.n))
              << "rows " << begin << "+" << rows;
        }
      }
    }
  }
}

// A column's bits do not depend on which register block computed it: every column range
// (full 6- or 8-column blocks, then tails of 4, 2 and 1) gives the full product's bits.
TEST_F(MatmulTest, ColumnsAreBitwiseIndependentOfTheColumnsComputedWithThem) {
  for (const Shape s : {Shape{5, 23, 77}, Shape{1, 23, 300}, Shape{16, 16, 288}}) {
    const Problem p = make_problem(s.m, s.n, s.k, 9 + s.n + s.k);
    for (IsaLevel level : levels_to_test()) {
      ScopedIsaLevel isa(level);
      for (ActivationPrecision precision :
           {ActivationPrecision::kFp32, ActivationPrecision::kBf16}) {
        SCOPED_TRACE(level_label(level) + " m=" + std::to_string(s.m) +
                     (precision == ActivationPrecision::kBf16 ? " bf16" : " fp32"));
        std::vector<float> full(static_cast<size_t>(s.m * s.n));
        matmul_bf16(rows_of(p, 0, s.m, full.data()), precision, nullptr);
        for (int64_t begin = 0; begin < s.n; ++begin) {
          for (int64_t count : {1, 2, 3, 4, 5, 7, 11}) {
            if (begin + count > s.n) continue;
            std::vector<float> part(static_cast<size_t>(s.m * count));
            MatmulBf16Args a = rows_of(p, 0, s.m, part.data());
            a.w = p.w.data() + begin * s.k;
            a.n = count;
            matmul_bf16(a, precision, nullptr);
            for (int64_t i = 0; i < s.m; ++i) {
              ASSERT_TRUE(
                  bitwise_equal(part.data() + i * count, full.data() + i * s.n + begin, count))
                  << "row " << i << ", columns " << begin << "+" << count;
            }
          }
        }
      }
    }
  }
}

TEST_F(MatmulTest, GroupedEqualsEachProblemAloneBitwise) {
  // Expert-like problems: few tokens each, different shapes, one with an odd weight stride.
  std::vector<Problem> problems;
  const Shape shapes[] = {{1, 96, 256}, {3, 40, 256}, {2, 96, 100},
                          {1, 7, 33},   {4, 130, 64}, {0, 8, 8}};
  uint64_t seed = 7;
  for (const Shape& s : shapes) problems.push_back(make_problem(s.m, s.n, s.k, ++seed));
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    for (ActivationPrecision precision : {ActivationPrecision::kFp32, ActivationPrecision::kBf16}) {
      SCOPED_TRACE(level_label(level));
      std::vector<std::vector<float>> grouped_out, alone_out;
      std::vector<MatmulBf16Args> args;
      for (const Problem& p : problems) {
        grouped_out.emplace_back(static_cast<size_t>(p.m * p.n) + 1, 0.5f);
        alone_out.emplace_back(static_cast<size_t>(p.m * p.n) + 1, 0.5f);
        args.push_back(rows_of(p, 0, p.m, grouped_out.back().data()));
        args.back().accumulate = (args.size() % 2) == 0;
      }
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2_, &pool3_}) {
        for (auto& g : grouped_out) std::fill(g.begin(), g.end(), 0.5f);
        grouped_matmul_bf16(args, precision, pool);
        for (size_t e = 0; e < problems.size(); ++e) {
          std::fill(alone_out[e].begin(), alone_out[e].end(), 0.5f);
          MatmulBf16Args a = args[e];
          a.y = alone_out[e].data();
          matmul_bf16(a, precision, nullptr);
          ASSERT_EQ(grouped_out[e], alone_out[e]) << "problem " << e;
        }
      }
    }
  }
}

TEST_F(MatmulTest, ZeroKOverwritesOrKeeps) {
  std::vector<float> y = {1, 2, 3, 4};
  MatmulBf16Args a;
  a.y = y.data();
  a.m = 2;
  a.n = 2;
  a.k = 0;
  a.accumulate = true;
  matmul_bf16(a, ActivationPrecision::kBf16, &pool2_);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4}));
  a.accumulate = false;
  matmul_bf16(a, ActivationPrecision::kFp32, &pool2_);
  EXPECT_EQ(y, (std::vector<float>{0, 0, 0, 0}));
}

TEST(MatmulDeathTest, StrideShorterThanKIsAProgrammerError) {
  std::vector<float> x(16), y(4);
  std::vector<bf16> w(16);
  MatmulBf16Args a;
  a.x = x.data();
  a.x_stride = 3;
  a.w = w.data();
  a.y = y.data();
  a.m = 2;
  a.n = 2;
  a.k = 4;
  EXPECT_DEATH(matmul_bf16(a, ActivationPrecision::kFp32, nullptr), "strides");
}

}  // namespace
}  // namespace peerserve::kernels
