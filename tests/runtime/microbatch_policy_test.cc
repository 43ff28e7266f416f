// The measured split policy: step-size buckets, both ways tried first, the faster kept, the
// slower re-measured once per kExploreEvery steps, a change of costs followed, and modes
// measured at different sizes of one bucket compared at one size.
#include "runtime/microbatch_policy.h"

#include <gtest/gtest.h>

namespace peerserve {
namespace {

TEST(MicrobatchPolicyTest, BucketsDoubleInSize) {
  EXPECT_EQ(MicrobatchPolicy::bucket_of(0), 0);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(1), 1);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(2), 2);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(3), 2);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(4), 3);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(64), 7);
  EXPECT_EQ(MicrobatchPolicy::bucket_of(int64_t{1} << 40), MicrobatchPolicy::kBuckets - 1);
}

// Runs `steps` steps of `tokens` rows through the policy, a step costing `whole` or `split`
// seconds per token; returns how many ran split.
int run(MicrobatchPolicy& policy, int64_t tokens, double whole, double split, int steps) {
  int splits = 0;
  for (int i = 0; i < steps; ++i) {
    const bool s = policy.split(tokens);
    splits += s ? 1 : 0;
    policy.record(tokens, s, static_cast<double>(tokens) * (s ? split : whole));
  }
  return splits;
}

TEST(MicrobatchPolicyTest, TriesBothThenKeepsTheFasterAndExploresRarely) {
  MicrobatchPolicy policy;
  // Warm-up: alternating, whole first.
  EXPECT_FALSE(policy.split(16));
  EXPECT_EQ(run(policy, 16, 1.0, 2.0, 2 * MicrobatchPolicy::kWarmupSamples),
            MicrobatchPolicy::kWarmupSamples);
  // Whole is faster: split runs only on exploration steps.
  const int steps = 10 * MicrobatchPolicy::kExploreEvery;
  const int explored = run(policy, 16, 1.0, 2.0, steps);
  EXPECT_GE(explored, 9);
  EXPECT_LE(explored, 11);
  EXPECT_NEAR(policy.predicted_seconds(16, false), 16.0, 1e-9);
  EXPECT_NEAR(policy.predicted_seconds(16, true), 32.0, 1e-9);
  // Other sizes are their own buckets: still in warm-up.
  EXPECT_EQ(policy.samples(MicrobatchPolicy::bucket_of(64), true), 0);
  EXPECT_FALSE(policy.split(64));
  // Split faster in a bucket of its own: kept there.
  run(policy, 64, 2.0, 1.0, 2 * MicrobatchPolicy::kWarmupSamples);
  EXPECT_TRUE(policy.split(64));
  EXPECT_FALSE(policy.split(16));
  const uint64_t plan = policy.plan();
  EXPECT_TRUE((plan >> MicrobatchPolicy::bucket_of(64)) & 1);
  EXPECT_FALSE((plan >> MicrobatchPolicy::bucket_of(16)) & 1);
}

TEST(MicrobatchPolicyTest, ASlowFirstStepDoesNotDecide) {
  // The first whole step pays one-time costs (5.0 per token), later ones cost 1.0; split
  // steps cost 1.5. An average over the first step (2.33) would run split; the first step
  // of a mode is not counted, so whole runs.
  MicrobatchPolicy policy;
  const int64_t tokens = 4;
  const double t = static_cast<double>(tokens);  // record() takes the step's seconds
  policy.record(tokens, false, 5.0 * t);
  policy.record(tokens, false, 1.0 * t);
  policy.record(tokens, false, 1.0 * t);
  for (int i = 0; i < MicrobatchPolicy::kWarmupSamples; ++i) policy.record(tokens, true, 1.5 * t);
  EXPECT_NEAR(policy.predicted_seconds(tokens, false), 1.0 * t, 1e-12);
  EXPECT_FALSE(policy.split(tokens));
}

TEST(MicrobatchPolicyTest, ComparesModesMeasuredAtDifferentSizesAtOneSize) {
  // Steps of 16..31 rows (one bucket), each costing a fixed 10 ms plus 0.05 ms a row, and
  // 10% more split. Compared per token, a mode sampled at 16 rows looked 1.8x dearer than
  // one at 31, and the slower mode ran on 5-8% of the steps; at one size it runs on the
  // exploration steps alone (1 in kExploreEvery).
  for (const double split_cost : {1.10, 0.90}) {
    MicrobatchPolicy policy;
    int slower = 0;
    const int steps = 40 * MicrobatchPolicy::kExploreEvery;
    for (int i = 0; i < steps; ++i) {
      const int64_t rows = 16 + (i * 7) % 16;  // every size of the bucket, in a shuffled order
      const bool split = policy.split(rows);
      const bool slower_mode = split == (split_cost > 1.0);
      if (i >= 2 * MicrobatchPolicy::kWarmupSamples && slower_mode) ++slower;
      const double seconds =
          (10e-3 + 0.05e-3 * static_cast<double>(rows)) * (split ? split_cost : 1.0);
      policy.record(rows, split, seconds);
    }
    EXPECT_LE(slower, steps / MicrobatchPolicy::kExploreEvery + 1) << "split cost " << split_cost;
    // The fit recovers the fixed part and the cost per row (within 0.5%: the slope is
    // shared, and here the split also scales the cost per row).
    EXPECT_NEAR(policy.predicted_seconds(16, false), 10.8e-3, 0.005 * 10.8e-3);
    EXPECT_NEAR(policy.predicted_seconds(31, false), 11.55e-3, 0.005 * 11.55e-3);
  }
}

TEST(MicrobatchPolicyTest, AStepOfOneRowNeverSplits) {
  // Nothing to overlap: not in warm-up, and not even when split steps measured faster.
  MicrobatchPolicy policy;
  EXPECT_EQ(run(policy, 1, 2.0, 1.0, 4 * MicrobatchPolicy::kExploreEvery), 0);
  for (int i = 0; i < 2 * MicrobatchPolicy::kWarmupSamples; ++i) policy.record(1, true, 0.1);
  EXPECT_FALSE(policy.split(1));
  EXPECT_FALSE((policy.plan() >> MicrobatchPolicy::bucket_of(1)) & 1);
  // Two rows can split (warm-up tries it).
  EXPECT_GT(run(policy, 2, 2.0, 1.0, 2 * MicrobatchPolicy::kWarmupSamples), 0);
}

TEST(MicrobatchPolicyTest, FollowsACostThatChanges) {
  MicrobatchPolicy policy;
  run(policy, 8, 1.0, 2.0, 2 * MicrobatchPolicy::kWarmupSamples);
  EXPECT_FALSE(policy.split(8));
  // The split becomes 4x cheaper: the exploration steps pull its average down until it wins.
  const int steps = 20 * MicrobatchPolicy::kExploreEvery;
  run(policy, 8, 1.0, 0.25, steps);
  EXPECT_TRUE(policy.split(8));
  // And back.
  run(policy, 8, 1.0, 3.0, steps);
  EXPECT_FALSE(policy.split(8));
}

TEST(MicrobatchPolicyTest, IgnoresEmptyStepsAndBadTimes) {
  MicrobatchPolicy policy;
  policy.record(0, true, 1.0);
  policy.record(4, true, -1.0);
  EXPECT_EQ(policy.samples(0, true), 0);
  EXPECT_EQ(policy.samples(MicrobatchPolicy::bucket_of(4), true), 0);
}

}  // namespace
}  // namespace peerserve
