// PackedBf16Matrix and the packed bf16 products (matmul_packed_bf16, grouped form) at every
// ISA level this CPU has: the packing bit for bit, the product against a double-precision
// reference of the same bf16 operands within the fp32 summation bound, every level but
// avx512_bf16 (vdpbf16ps) against a plain sequential sum (bitwise: the order the header
// promises), and batch
// invariance (bitwise) across row subsets, thread counts and grouping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "kernels/bf16_matrix.h"
#include "kernels/matmul_packed_bf16.h"

namespace peerserve::kernels {
namespace {

using testing::kUnitRoundoff;
using testing::level_label;
using testing::levels_to_test;
using testing::Random;

struct Shape {
  int64_t m, n, k;
};

// m = 0 and 1 (decode), n leaving panel tails and crossing the 4-panel register block, odd k
// (pair padding), m crossing the 6-row register block and (70 x 2048) the 256 KiB row block,
// k = 2048 (4 KiB panels: the stride padding).
const Shape kShapes[] = {
    {1, 1, 1},   {0, 5, 7},     {1, 17, 33},   {3, 7, 0},      {5, 37, 100},  {2, 3, 16},
    {7, 64, 32}, {9, 13, 47},   {1, 130, 31},  {4, 80, 257},   {13, 50, 129}, {1, 9, 1000},
    {6, 80, 64}, {8, 33, 2048}, {70, 5, 2048}, {16, 100, 300}, {25, 65, 15},
};

std::string describe(const Shape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

float widened(bf16 v) {
  return bf16_to_float(v);
}

PackedBf16Matrix pack_or_die(const std::vector<bf16>& w, int64_t n, int64_t k, int64_t stride) {
  Result<PackedBf16Matrix> packed = PackedBf16Matrix::pack({w.data(), n, k, stride});
  PS_CHECK(packed.ok()) << packed.status().to_string();
  return std::move(packed).value();
}

class MatmulPackedBf16Test : public ::testing::Test {
 protected:
  ThreadPool pool2_{2};
  ThreadPool pool3_{3};
};

TEST_F(MatmulPackedBf16Test, PrintsTheIsaLevelsItExercises) {
  std::string line = "[ isa ]";
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    line += " " + std::string(isa_level_name(level)) + (packed_bf16_is_fast() ? "(fast)" : "");
  }
  std::printf("%s (packed bf16: scalar; avx2/avx512 FMA; avx512_bf16 vdpbf16ps)\n", line.c_str());
  EXPECT_EQ(levels_to_test().front(), IsaLevel::kScalar);
}

TEST_F(MatmulPackedBf16Test, PacksEveryValueBitForBit) {
  Random rng(3);
  for (const Shape& s : kShapes) {
    const int64_t stride = s.k + 3;
    std::vector<bf16> w = rng.bf16s(static_cast<size_t>(std::max<int64_t>(1, s.n * stride)), -4, 4);
    const PackedBf16Matrix packed = pack_or_die(w, s.n, s.k, stride);
    ASSERT_EQ(packed.rows(), s.n);
    ASSERT_EQ(packed.cols(), s.k);
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t p = 0; p < s.k; ++p) {
        ASSERT_EQ(packed.value(j, p).bits, w[static_cast<size_t>(j * stride + p)].bits)
            << describe(s) << " j=" << j << " p=" << p;
      }
    }
  }
  // 2 panels of 16 columns, k = 10 in 5 pairs: 2 * 5 * 64 bytes. k = 2048 gives 4 KiB panels,
  // padded by one cache line.
  std::vector<bf16> w(static_cast<size_t>(19 * 2048));
  EXPECT_EQ(pack_or_die(w, 19, 10, 0).bytes(), 2 * 5 * 64);
  EXPECT_EQ(pack_or_die(w, 19, 2048, 0).panel_stride(), 1024 * 32 + 32);
}

TEST_F(MatmulPackedBf16Test, RejectsBadViewsWithAClearError) {
  std::vector<bf16> w(4);
  auto stride = PackedBf16Matrix::pack({w.data(), 2, 2, 1});
  ASSERT_FALSE(stride.ok());
  EXPECT_NE(stride.status().message().find("row stride 1 is below the 2 columns"),
            std::string::npos);
  auto null = PackedBf16Matrix::pack({nullptr, 2, 2, 0});
  ASSERT_FALSE(null.ok());
  EXPECT_NE(null.status().message().find("null data"), std::string::npos);
  auto negative = PackedBf16Matrix::pack({w.data(), -1, 2, 0});
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  auto empty = PackedBf16Matrix::pack({nullptr, 0, 5, 0});
  EXPECT_TRUE(empty.ok());
}

// One case at one level: y against a double reference of bf16(x) * w within the bound of
// matmul_packed_bf16.h; at the FMA and scalar levels also bitwise against a sequential sum.
void check_case(IsaLevel level, const Shape& s, bool strided, bool accumulate, ThreadPool* pool,
                uint64_t seed) {
  SCOPED_TRACE(level_label(level) + " " + describe(s) + (strided ? " strided" : "") +
               (accumulate ? " accumulate" : "") +
               " threads=" + std::to_string(pool ? pool->num_threads() : 1));
  Random rng(seed);
  const int64_t xs = strided ? s.k + 3 : s.k, ws = strided ? s.k + 5 : s.k,
                ys = strided ? s.n + 2 : s.n;
  std::vector<bf16> wv = rng.bf16s(static_cast<size_t>(std::max<int64_t>(1, s.n * ws)), -2, 2);
  const PackedBf16Matrix w = pack_or_die(wv, s.n, s.k, ws);
  std::vector<float> x = rng.floats(static_cast<size_t>(s.m * xs + 1), -2, 2);
  std::vector<float> y = rng.floats(static_cast<size_t>(s.m * ys + 2));
  const std::vector<float> y_before = y;
  float* y0 = y.data() + 1;

  MatmulPackedBf16Args args;
  args.x = x.data();
  args.x_stride = strided ? xs : 0;
  args.w = &w;
  args.y = y0;
  args.y_stride = strided ? ys : 0;
  args.m = s.m;
  args.accumulate = accumulate;
  ScopedIsaLevel isa(level);
  matmul_packed_bf16(args, pool);

  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0, magnitude = 0;
      float sequential = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const float xb = widened(float_to_bf16(x[static_cast<size_t>(i * xs + p)]));
        const float wb = widened(wv[static_cast<size_t>(j * ws + p)]);
        exact += static_cast<double>(xb) * wb;
        magnitude += std::fabs(static_cast<double>(xb) * wb);
        sequential += xb * wb;  // exact product, one rounding per addition
      }
      const float base = accumulate ? y_before[static_cast<size_t>(1 + i * ys + j)] : 0.0f;
      const double got = y0[i * ys + j];
      // k additions in one chain, plus the accumulate.
      const double tol =
          (static_cast<double>(s.k) + 2) * kUnitRoundoff * (magnitude + std::fabs(base)) + 1e-37;
      ASSERT_NEAR(got, base + exact, tol) << "at i=" << i << " j=" << j;
      if (level != IsaLevel::kAvx512Bf16) {  // vdpbf16ps has its own order (and flushes)
        ASSERT_EQ(got, accumulate ? base + sequential : sequential)
            << "sequential order at i=" << i << " j=" << j;
      }
    }
    for (int64_t j = s.n; j < ys && i + 1 < s.m; ++j) {
      ASSERT_EQ(y0[i * ys + j], y_before[static_cast<size_t>(1 + i * ys + j)]);
    }
  }
  EXPECT_EQ(y.front(), y_before.front());
  EXPECT_EQ(y.back(), y_before.back());
}

TEST_F(MatmulPackedBf16Test, MatchesTheReferenceAtEveryLevel) {
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 3; ++variant) {
      ++seed;
      const bool strided = variant > 0, accumulate = variant == 1;
      ThreadPool* pool = variant == 0 ? nullptr : variant == 1 ? &pool2_ : &pool3_;
      for (IsaLevel level : levels_to_test()) {
        check_case(level, s, strided, accumulate, pool, seed);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(MatmulPackedBf16Test, BatchInvariantAcrossRowsThreadsAndGrouping) {
  Random rng(17);
  const int64_t m = 70, n = 150, k = 300;
  std::vector<bf16> wv = rng.bf16s(static_cast<size_t>(n * k));
  const PackedBf16Matrix w = pack_or_die(wv, n, k, 0);
  std::vector<bf16> w2v = rng.bf16s(static_cast<size_t>(40 * k));
  const PackedBf16Matrix w2 = pack_or_die(w2v, 40, k, 0);
  std::vector<float> x = rng.floats(static_cast<size_t>(m * k), -3, 3);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    std::vector<float> full(static_cast<size_t>(m * n));
    matmul_packed_bf16({x.data(), 0, &w, full.data(), 0, m, false}, &pool2_);
    // Each row alone, on no pool.
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> row(static_cast<size_t>(n));
      matmul_packed_bf16({x.data() + i * k, 0, &w, row.data(), 0, 1, false}, nullptr);
      ASSERT_TRUE(std::equal(row.begin(), row.end(), full.begin() + i * n)) << "row " << i;
    }
    // Uneven sub-batches on 3 threads, grouped with an unrelated problem.
    std::vector<float> parts(static_cast<size_t>(m * n)), other(static_cast<size_t>(5 * 40));
    std::vector<MatmulPackedBf16Args> group;
    const int64_t cuts[] = {0, 1, 4, 11, 30, 70};
    for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
      group.push_back({x.data() + cuts[c] * k, 0, &w, parts.data() + cuts[c] * n, 0,
                       cuts[c + 1] - cuts[c], false});
    }
    group.push_back({x.data(), 0, &w2, other.data(), 0, 5, false});
    grouped_matmul_packed_bf16(group, &pool3_);
    ASSERT_EQ(parts, full);
    std::vector<float> other_alone(other.size());
    matmul_packed_bf16({x.data(), 0, &w2, other_alone.data(), 0, 5, false}, nullptr);
    ASSERT_EQ(other, other_alone);
  }
}

// MoE experts with a few tokens each: no problem alone is large enough for the threads, all
// of them together are (the activations of every problem are rounded in one parallel pass).
TEST_F(MatmulPackedBf16Test, ManySmallGroupedProblemsOnThreadsEqualEachAlone) {
  Random rng(19);
  const int64_t n = 48, k = 512, problems = 24;
  std::vector<std::vector<bf16>> wvs;
  std::vector<PackedBf16Matrix> ws;
  std::vector<std::vector<float>> xs;
  for (int64_t e = 0; e < problems; ++e) {
    wvs.push_back(rng.bf16s(static_cast<size_t>(n * k)));
    ws.push_back(pack_or_die(wvs.back(), n, k, 0));
    xs.push_back(rng.floats(static_cast<size_t>((1 + e % 12) * k), -3, 3));
  }
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    std::vector<std::vector<float>> ys(static_cast<size_t>(problems));
    std::vector<MatmulPackedBf16Args> group;
    int64_t elements = 0;
    for (int64_t e = 0; e < problems; ++e) {
      const int64_t m = 1 + e % 12;
      ys[e].assign(static_cast<size_t>(m * n), 0.0f);
      group.push_back({xs[e].data(), 0, &ws[e], ys[e].data(), 0, m, false});
      elements += m * k;
    }
    ASSERT_GE(elements, 64 * 1024);  // above the threshold of a parallel conversion
    grouped_matmul_packed_bf16(group, &pool2_);
    for (int64_t e = 0; e < problems; ++e) {
      std::vector<float> alone(ys[e].size());
      matmul_packed_bf16({xs[e].data(), 0, &ws[e], alone.data(), 0, 1 + e % 12, false}, nullptr);
      ASSERT_EQ(ys[e], alone) << "problem " << e;
    }
  }
}

}  // namespace
}  // namespace peerserve::kernels
