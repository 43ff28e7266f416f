// The exponential race's per-token uniforms and candidate filter (kernels/race_uniforms.h):
// uniforms in (0, 1), uniform by chi-square, different per base; the candidate lists of every
// available ISA level against a plain loop with its own SplitMix64, over the vector bodies'
// tails, zero weights and bars from loose to strict.
#include "kernels/race_uniforms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"

namespace peerserve::kernels {
namespace {

uint64_t plain_splitmix(uint64_t state) {
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double plain_uniform(uint64_t base, uint64_t token) {
  const uint64_t bits = plain_splitmix(base + 0x9E3779B97F4A7C15ULL * (token + 1)) >> 11;
  return (static_cast<double>(bits) + 0.5) / 9007199254740992.0;  // 2^53
}

TEST(RaceUniforms, AreUniformInTheOpenIntervalAndDifferPerBase) {
  constexpr int kBins = 20, kDraws = 100000;
  std::vector<int> bins(kBins, 0);
  int same_as_other_base = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = race_uniform(12345, static_cast<uint64_t>(i));
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, plain_uniform(12345, static_cast<uint64_t>(i)));
    bins[static_cast<size_t>(u * kBins)]++;
    if (u == race_uniform(12346, static_cast<uint64_t>(i))) ++same_as_other_base;
  }
  double chi_square = 0;
  const double e = static_cast<double>(kDraws) / kBins;
  for (int c : bins) chi_square += (c - e) * (c - e) / e;
  EXPECT_LT(chi_square, 50.0);  // 19 degrees of freedom; the 99.999th percentile is ~49
  EXPECT_EQ(same_as_other_base, 0);
}

TEST(RaceUniforms, CandidatesAtEveryIsaLevelMatchAPlainLoop) {
  std::mt19937 rng(7);
  std::exponential_distribution<float> spread(1.0f);
  for (size_t n : {0, 1, 3, 4, 7, 8, 9, 13, 64, 1000, 4099}) {
    std::vector<float> weight(n);
    for (size_t i = 0; i < n; ++i) weight[i] = i % 5 == 3 ? 0.0f : std::exp(-4.0f * spread(rng));
    for (const double bar : {0.01, 1.0, 20.0, 1e6}) {
      for (const uint64_t base : {uint64_t{1}, uint64_t{0xFFFFFFFFFFFFFFFFULL}}) {
        std::vector<uint32_t> expected;
        for (size_t i = 0; i < n; ++i) {
          const double w = weight[i];
          if (w > 0.0 && (1.0 - plain_uniform(base, i)) * bar < w) {
            expected.push_back(static_cast<uint32_t>(i));
          }
        }
        for (IsaLevel level : supported_isa_levels()) {
          ScopedIsaLevel scoped(level);
          std::vector<uint32_t> got(n);
          got.resize(race_candidates(weight.data(), n, base, bar, got.data()));
          EXPECT_EQ(got, expected) << isa_level_name(level) << " n " << n << " bar " << bar;
        }
        if (bar == 1e6 && n > 100) {
          EXPECT_LT(expected.size(), n / 10);  // the filter filters
        }
      }
    }
  }
}

// The largest hash: (2^53 - 1) + 0.5 is a tie that rounds to 2^53, so U came out 1 and
// -ln U = -0 (weight / E = -inf in the race), and the filter kept the token for any bar. Now
// U is the largest double below 1 there, at every level; the base is the one whose token 5
// hashes to the top (found by inverting SplitMix64's finalizer).
TEST(RaceUniforms, TheLargestHashStaysBelowOne) {
  constexpr uint64_t kBase = 0xde58cfff1a2bdaceULL;
  ASSERT_EQ(plain_splitmix(kBase + 0x9E3779B97F4A7C15ULL * 6) >> 11, (uint64_t{1} << 53) - 1);
  EXPECT_EQ(plain_uniform(kBase, 5), 1.0);  // the unclamped formula
  EXPECT_EQ(race_uniform(kBase, 5), 0x1.fffffffffffffp-1);
  EXPECT_GT(-std::log(race_uniform(kBase, 5)), 0.0);
  std::vector<float> weight(16, 1e-30f);
  for (IsaLevel level : supported_isa_levels()) {
    ScopedIsaLevel scoped(level);
    std::vector<uint32_t> got(weight.size());
    got.resize(race_candidates(weight.data(), weight.size(), kBase, 1e300, got.data()));
    EXPECT_TRUE(got.empty()) << isa_level_name(level) << ": " << got.size() << " candidates";
  }
}

}  // namespace
}  // namespace peerserve::kernels
