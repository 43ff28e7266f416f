#include "model/checkpoint/deterministic_normal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace peerserve {
namespace {

// Our log/cos/sin must agree with libm to ~1e-15 relative; they exist only to be identical
// everywhere, not to be more accurate.
TEST(DeterministicNormalTest, LogAndTrigMatchLibm) {
  for (double x : {1e-300, 1e-16, 1e-5, 0.1, 0.5, 0.70710678, 0.999999, 1.0, 1.5, 2.0, 1e10}) {
    EXPECT_NEAR(deterministic_log(x), std::log(x), 2e-15 * std::max(1.0, std::fabs(std::log(x))))
        << x;
  }
  for (int i = 0; i <= 1000; ++i) {
    const double t = i / 1000.0 - 0.3;
    EXPECT_NEAR(deterministic_cos_2pi(t), std::cos(2 * M_PI * t), 2e-15) << t;
    EXPECT_NEAR(deterministic_sin_2pi(t), std::sin(2 * M_PI * t), 2e-15) << t;
  }
}

TEST(DeterministicNormalTest, SplitMix64KnownSequence) {
  // SplitMix64 with seed 0; values from an independent Python transcription of the algorithm.
  DeterministicNormal rng(0);
  EXPECT_EQ(rng.next_u64(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.next_u64(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.next_u64(), 0x06c45d188009454full);
}

TEST(DeterministicNormalTest, MomentsOfStandardNormal) {
  DeterministicNormal rng(12345);
  constexpr int kSamples = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int beyond_2sigma = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double x = rng.next_normal();
    sum += x;
    sum2 += x * x;
    sum4 += x * x * x * x;
    beyond_2sigma += std::fabs(x) > 2.0;
  }
  // Standard errors at n = 2e5: mean 0.0022, variance 0.0032, kurtosis ~0.011; 5 sigma bounds.
  EXPECT_NEAR(sum / kSamples, 0.0, 0.012);
  EXPECT_NEAR(sum2 / kSamples, 1.0, 0.016);
  EXPECT_NEAR(sum4 / kSamples, 3.0, 0.06);
  EXPECT_NEAR(static_cast<double>(beyond_2sigma) / kSamples, 0.0455, 0.0025);
}

TEST(DeterministicNormalTest, SameSeedSameStream) {
  DeterministicNormal a(99), b(99), c(100);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.next_normal(), y = b.next_normal(), z = c.next_normal();
    ASSERT_EQ(x, y);
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
}

// SplitMix64's output function inverted, so that a test can pick the state whose output is
// a given 64-bit value.
uint64_t unxorshift(uint64_t y, int shift) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ (x >> shift);
  return x;
}
uint64_t inverse_odd(uint64_t a) {
  uint64_t inv = a;  // Newton's iteration doubles the correct low bits each step
  for (int i = 0; i < 6; ++i) inv *= 2 - a * inv;
  return inv;
}
uint64_t splitmix_unmix(uint64_t out) {
  uint64_t z = unxorshift(out, 31);
  z *= inverse_odd(0x94d049bb133111ebull);
  z = unxorshift(z, 27);
  z *= inverse_odd(0xbf58476d1ce4e5b9ull);
  return unxorshift(z, 30);
}
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// next_normals (SIMD over many pairs) equals next_normal value for value, for every kernel
// this CPU has, any length, and any split of the stream between the two.
void expect_batches_equal_scalar(uint64_t seed, size_t n) {
  std::vector<double> reference(n);
  DeterministicNormal scalar(seed);
  for (double& v : reference) v = scalar.next_normal();
  const double after = scalar.next_normal();
  for (int width : {8, 4, 1}) {
    const int previous = set_normal_simd_width_cap_for_testing(width);
    for (size_t split : {size_t{0}, size_t{1}, n / 3, n}) {
      if (split > n) continue;
      DeterministicNormal batched(seed);
      std::vector<double> values(n);
      batched.next_normals(std::span<double>(values).first(split));
      batched.next_normals(std::span<double>(values).subspan(split));
      // (n may be 0: memcmp must not see the empty vectors' null data.)
      ASSERT_TRUE(n == 0 || std::memcmp(values.data(), reference.data(), n * sizeof(double)) == 0)
          << "seed " << seed << " n " << n << " width " << width << " split " << split;
      EXPECT_EQ(batched.next_normal(), after) << "the state after the batch differs";
    }
    set_normal_simd_width_cap_for_testing(previous);
  }
}

TEST(DeterministicNormalTest, BatchEqualsOneAtATime) {
  for (uint64_t seed : {0ull, 1ull, 12345ull, 0xdeadbeefcafebabeull}) {
    for (size_t n : {0, 1, 2, 3, 7, 8, 15, 16, 17, 33, 1000, 4097}) {
      expect_batches_equal_scalar(seed, n);
    }
  }
  expect_batches_equal_scalar(42, 2'000'000);
}

// Uniforms at the edges of every branch of the scalar code: 1.0 (log 0; turns 1 reduces to 0)
// and the smallest one (2^-53), the quadrant boundaries 1/4, 1/2, 3/4 and their neighbours.
// Each is placed as the first or the second uniform of a pair in the middle of a SIMD batch.
TEST(DeterministicNormalTest, BatchEqualsOneAtATimeAtBranchEdges) {
  std::vector<uint64_t> outputs = {~0ull, 0ull};
  for (uint64_t quarter : {1, 2, 3}) {
    const uint64_t k = quarter << 51;  // uniform = k * 2^-53 = quarter / 4
    for (uint64_t m : {k - 2, k - 1, k}) outputs.push_back(m << 11);
  }
  outputs.push_back(((1ull << 52) + 12345) << 11);  // exactly-representable mantissa
  for (uint64_t out : outputs) {
    for (uint64_t index : {20, 21}) {  // the uniforms of pair 10 (a SIMD lane in any width)
      const uint64_t seed = splitmix_unmix(out) - (index + 1) * kGamma;
      DeterministicNormal check(seed);
      for (uint64_t i = 0; i < index; ++i) check.next_u64();
      ASSERT_EQ(check.next_u64(), out);
      expect_batches_equal_scalar(seed, 64);
    }
  }
}

TEST(DeterministicNormalTest, AtNormalIndexContinuesTheStream) {
  DeterministicNormal fresh(77);
  std::vector<double> values(100);
  for (double& v : values) v = fresh.next_normal();
  for (uint64_t index : {0, 1, 2, 3, 50, 51, 99}) {
    DeterministicNormal jumped = DeterministicNormal::at_normal_index(77, index);
    for (size_t i = index; i < values.size(); ++i) {
      ASSERT_EQ(jumped.next_normal(), values[i]) << index << " " << i;
    }
  }
  // Wraps as the state does.
  DeterministicNormal far = DeterministicNormal::at_normal_index(~0ull, 1ull << 62);
  DeterministicNormal same(~0ull + (1ull << 62) * kGamma);
  EXPECT_EQ(far.next_normal(), same.next_normal());
}

}  // namespace
}  // namespace peerserve
