#include "serve/bench_client.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace peerserve {
namespace {

TEST(BenchClientTest, PercentileMatchesNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97]
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_EQ(percentile({7}, 99), 7.0);
}

TEST(BenchClientTest, PromptsShareTheRequestedPrefix) {
  BenchOptions o;
  o.num_prompts = 20;
  o.input_len = 100;
  o.prefix_share = 0.9;
  auto prompts = make_bench_prompts(o);
  ASSERT_EQ(prompts.size(), 20u);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& p : prompts) {
    ASSERT_EQ(p.size(), 100u);
    EXPECT_TRUE(std::equal(p.begin(), p.begin() + 90, prompts[0].begin()));
    for (int32_t t : p) {
      EXPECT_GE(t, o.token_low);
      EXPECT_LT(t, o.token_high);
    }
    distinct.insert(std::vector<int32_t>(p.begin() + 90, p.end()));
  }
  EXPECT_EQ(distinct.size(), 20u);  // the unique tails differ
  // Same seed, same prompts; another seed, another prefix.
  EXPECT_EQ(make_bench_prompts(o), prompts);
  o.seed = 5;
  EXPECT_NE(make_bench_prompts(o)[0], prompts[0]);
}

TEST(BenchClientTest, PoissonArrivalsHaveTheRequestedRate) {
  BenchOptions o;
  o.num_prompts = 20000;
  o.request_rate = 50.0;
  auto t = make_arrival_times(o);
  ASSERT_EQ(t.size(), 20000u);
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  // Mean gap 1/50 s; the sample mean of 20000 exponential gaps is within ~3% at 4 sigma
  // (relative standard error 1/sqrt(20000) = 0.7%).
  const double mean_gap = t.back() / (t.size() - 1);
  EXPECT_NEAR(mean_gap, 0.02, 0.02 * 0.03);
  o.request_rate = std::numeric_limits<double>::infinity();
  for (double x : make_arrival_times(o)) ASSERT_EQ(x, 0.0);
}

TEST(BenchClientTest, OptionValidation) {
  BenchOptions o;
  EXPECT_TRUE(o.validate().ok());
  o.prefix_share = 1.5;
  EXPECT_FALSE(o.validate().ok());
  o = BenchOptions{};
  o.endpoint = "/v1/chat/completions";
  EXPECT_FALSE(o.validate().ok());
  o = BenchOptions{};
  o.token_low = 10;
  o.token_high = 10;
  EXPECT_FALSE(o.validate().ok());
}

TEST(BenchClientTest, UnreachableServerIsAnErrorNotACrash) {
  BenchOptions o;
  o.url = "http://127.0.0.1:1";  // nothing listens on port 1
  o.num_prompts = 1;
  auto r = run_bench(o);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace peerserve
