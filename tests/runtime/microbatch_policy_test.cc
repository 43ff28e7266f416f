// The measured split policy: step-size buckets, both ways tried first, the faster kept, the
// slower re-measured once per kExploreEvery steps, and a change of costs followed.
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
  EXPECT_DOUBLE_EQ(policy.seconds_per_token(MicrobatchPolicy::bucket_of(16), false), 1.0);
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
  // steps cost 1.5. A moving average started from the first step (5.0, 4.2, 3.56) would run
  // split; the warm-up keeps the lowest time and runs whole.
  MicrobatchPolicy policy;
  const int64_t tokens = 4;
  const double t = static_cast<double>(tokens);  // record() takes the step's seconds
  policy.record(tokens, false, 5.0 * t);
  policy.record(tokens, false, 1.0 * t);
  policy.record(tokens, false, 1.0 * t);
  for (int i = 0; i < MicrobatchPolicy::kWarmupSamples; ++i) policy.record(tokens, true, 1.5 * t);
  EXPECT_DOUBLE_EQ(policy.seconds_per_token(MicrobatchPolicy::bucket_of(tokens), false), 1.0);
  EXPECT_FALSE(policy.split(tokens));
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
