// The auto guard: the binomial tail it tests with, against a plain sum; how soon it stops a
// useless head; and, simulated, that a head accepting at break-even is stopped early in at
// most ~1% of streams while one far below it is stopped in nearly all.
#include "runtime/speculative_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace peerserve {
namespace {

// P(X <= k) by the textbook sum, each C(n, i) built multiplicatively (exact enough for n <= 40).
double plain_binomial_cdf(int k, int n, double p) {
  double sum = 0;
  for (int i = 0; i <= k && i <= n; ++i) {
    double choose = 1;
    for (int j = 1; j <= i; ++j) choose = choose * (n - i + j) / j;
    sum += choose * std::pow(p, i) * std::pow(1 - p, n - i);
  }
  return sum;
}

TEST(SpeculativeGuardTest, BinomialTailMatchesThePlainSum) {
  for (const int n : {1, 2, 8, 17, 40}) {
    for (const double p : {0.01, 0.3, 0.5, 0.66, 0.93}) {
      for (int k = 0; k < n; ++k) {
        const double expected = plain_binomial_cdf(k, n, p);
        EXPECT_NEAR(binomial_cdf(k, n, p), expected, 1e-12 + 1e-9 * expected)
            << "k " << k << " n " << n << " p " << p;
      }
      EXPECT_EQ(binomial_cdf(n, n, p), 1.0);
      EXPECT_EQ(binomial_cdf(-1, n, p), 0.0);
    }
  }
  // Large n stays finite where single terms underflow; the two tails add up to 1.
  const double lower = binomial_cdf(600, 1000, 0.66);
  const double upper = binomial_cdf(1000 - 601, 1000, 0.34);  // P(X >= 601) by symmetry
  EXPECT_TRUE(std::isfinite(lower));
  EXPECT_NEAR(lower + upper, 1.0, 1e-9);
  EXPECT_LT(lower, 1e-4);  // 600 of 1000 is ~4 standard deviations below 660
  EXPECT_EQ(binomial_cdf(3, 10, 0.0), 1.0);
  EXPECT_EQ(binomial_cdf(3, 10, 1.0), 0.0);
}

TEST(SpeculativeGuardTest, CheckpointsBelowTheFinalCount) {
  EXPECT_EQ(SpeculativeGuard(256, 0.5).num_checkpoints(), 5);  // 8 16 32 64 128
  EXPECT_EQ(SpeculativeGuard(64, 0.5).num_checkpoints(), 3);
  EXPECT_EQ(SpeculativeGuard(8, 0.5).num_checkpoints(), 0);
  EXPECT_EQ(SpeculativeGuard(0, 0.5).num_checkpoints(), 0);
}

TEST(SpeculativeGuardTest, StopsAUselessHeadEarly) {
  {
    // Break-even 66%: 0 of 8 has probability 0.34^8 = 1.8e-4 < 1% / 5.
    SpeculativeGuard guard(256, 0.66);
    for (int i = 0; i < 7; ++i) EXPECT_FALSE(guard.record(1, 0)) << i;
    EXPECT_TRUE(guard.record(1, 0));
  }
  {
    // Break-even 50%: 0.5^8 = 3.9e-3 is not below 2e-3, 0.5^16 is.
    SpeculativeGuard guard(256, 0.5);
    for (int i = 0; i < 15; ++i) EXPECT_FALSE(guard.record(1, 0)) << i;
    EXPECT_TRUE(guard.record(1, 0));
  }
  {
    // A step of 32 drafts passes three checkpoints but makes one test.
    SpeculativeGuard guard(256, 0.66);
    EXPECT_TRUE(guard.record(32, 2));
    EXPECT_EQ(guard.verified(), 32);
    EXPECT_EQ(guard.accepted(), 2);
  }
  {
    // No guard, and a break-even of 0: never stopped.
    SpeculativeGuard off(0, 0.66);
    SpeculativeGuard free(256, 0.0);
    for (int i = 0; i < 300; ++i) {
      EXPECT_FALSE(off.record(1, 0));
      EXPECT_FALSE(free.record(1, 0));
    }
  }
}

TEST(SpeculativeGuardTest, FinalCountUsesThePointEstimate) {
  // 60% accepted against a break-even of 66%: too close for the early test, stopped at 256.
  SpeculativeGuard guard(256, 0.66);
  bool stopped = false;
  int64_t stopped_at = 0;
  for (int i = 0; i < 64 && !stopped; ++i) {
    stopped = guard.record(4, i % 5 < 3 ? 3 : 2);  // 12 of 20 per five steps
    stopped_at = guard.verified();
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(stopped_at, 256);
  // 70% against 66%: kept.
  SpeculativeGuard good(256, 0.66);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(good.record(10, 7)) << i;
}

// Streams of drafts accepted at `rate`, `batch` per step, until the final count: the
// fraction the guard stopped before it.
double early_stop_fraction(double rate, double break_even, int batch, int streams) {
  std::mt19937_64 rng(20261130);
  std::bernoulli_distribution accept(rate);
  int stopped = 0;
  for (int s = 0; s < streams; ++s) {
    SpeculativeGuard guard(256, break_even);
    while (guard.verified() + batch < 256) {
      int accepted = 0;
      for (int b = 0; b < batch; ++b) accepted += accept(rng) ? 1 : 0;
      if (guard.record(batch, accepted)) {
        ++stopped;
        break;
      }
    }
  }
  return static_cast<double>(stopped) / streams;
}

TEST(SpeculativeGuardTest, HeadAtBreakEvenIsRarelyStoppedEarly) {
  // The union bound promises at most 1%; 4000 streams leave a standard error of 0.16%.
  for (const int batch : {1, 8}) {
    for (const double break_even : {0.5, 0.66, 0.9}) {
      const double fraction = early_stop_fraction(break_even, break_even, batch, 4000);
      EXPECT_LE(fraction, 0.015) << "batch " << batch << " break-even " << break_even;
    }
  }
}

TEST(SpeculativeGuardTest, HeadFarBelowBreakEvenIsStoppedEarly) {
  for (const int batch : {1, 8}) {
    EXPECT_GE(early_stop_fraction(0.3, 0.66, batch, 1000), 0.99) << batch;
    EXPECT_EQ(early_stop_fraction(0.0, 0.66, batch, 100), 1.0) << batch;
  }
}

}  // namespace
}  // namespace peerserve
