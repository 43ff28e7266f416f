// Synthetic routing: the requested popularity skew and correlations show up in the traces.
#include "plan/placement/synthetic_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "plan/placement/expert_routing_load.h"
#include "plan/placement/routing_statistics.h"

namespace peerserve::plan {
namespace {

// Independent reference for the capped Zipf shares: find the scale c with
// sum_i min(1, c·w_i) = k by bisection (the library water-fills instead).
std::vector<double> reference_inclusion(int n, int k, double s) {
  std::vector<double> w(n);
  for (int i = 0; i < n; ++i) w[i] = 1.0 / std::pow(i + 1.0, s);
  double lo = 0, hi = 1e12;
  for (int it = 0; it < 400; ++it) {
    const double c = 0.5 * (lo + hi);
    double total = 0;
    for (double x : w) total += std::min(1.0, c * x);
    (total < k ? lo : hi) = c;
  }
  std::vector<double> pi(n);
  for (int i = 0; i < n; ++i) pi[i] = std::min(1.0, 0.5 * (lo + hi) * w[i]);
  return pi;
}

TEST(ZipfInclusion, MatchesAnIndependentBisection) {
  for (double s : {0.0, 0.5, 1.0, 1.5, 3.0}) {
    const auto pi = zipf_inclusion_probabilities(64, 8, s);
    const auto ref = reference_inclusion(64, 8, s);
    ASSERT_EQ(pi.size(), ref.size());
    for (size_t i = 0; i < pi.size(); ++i) EXPECT_NEAR(pi[i], ref[i], 1e-9) << s << " " << i;
    EXPECT_NEAR(std::accumulate(pi.begin(), pi.end(), 0.0), 8.0, 1e-9);
  }
  // s = 3 concentrates enough that the hottest experts are capped at one selection per token.
  EXPECT_DOUBLE_EQ(zipf_inclusion_probabilities(64, 8, 3.0).front(), 1.0);
}

TEST(ZipfInclusion, SolvesForARequestedMaxOverMean) {
  auto s = zipf_skew_for_max_over_mean(256, 8, 16.0);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(reference_inclusion(256, 8, *s).front() / (8.0 / 256), 16.0, 1e-6);
  EXPECT_NEAR(*zipf_skew_for_max_over_mean(256, 8, 1.0), 0.0, 1e-9);
  auto too_much = zipf_skew_for_max_over_mean(256, 8, 40.0);
  ASSERT_FALSE(too_much.ok());
  EXPECT_NE(too_much.status().message().find("expected in [1, 32"), std::string::npos);
}

SyntheticRoutingOptions small_options() {
  SyntheticRoutingOptions o;
  o.num_experts = 64;
  o.top_k = 4;
  o.num_dense_layers = 1;
  o.num_moe_layers = 3;
  o.num_requests = 40;
  o.min_prefill_tokens = 100;
  o.max_prefill_tokens = 150;
  o.decode_steps = 100;
  o.popularity_skew = 1.2;
  o.seed = 11;
  return o;
}

// Binomial tolerance for a selection count with probability p over n tokens. Tokens are
// independent only without correlation; with token_repeat a the variance grows by about
// (1 + a)/(1 − a), which `inflation` covers.
double tolerance(double p, double n, double inflation = 1.0) {
  return 5.0 * std::sqrt(n * p * (1 - p) * inflation) + 1.0;
}

void expect_marginals_match(const SyntheticRoutingOptions& o, double inflation) {
  auto routing = generate_synthetic_routing(o);
  ASSERT_TRUE(routing.ok()) << routing.status().to_string();
  auto load = expert_load_from_routing(routing->requests, o.num_experts, RoutingPhase::kAll);
  ASSERT_TRUE(load.ok());
  double tokens = 0;
  for (const auto& r : routing->requests) tokens += r.num_tokens();
  const auto pi = reference_inclusion(o.num_experts, o.top_k, o.popularity_skew);
  for (int l = 0; l < o.num_moe_layers; ++l) {
    const auto& order = routing->expert_at_rank[0][l];
    for (int rank = 0; rank < o.num_experts; ++rank) {
      const double count = load->counts[l][order[rank]];
      EXPECT_NEAR(count, pi[rank] * tokens, tolerance(pi[rank], tokens, inflation))
          << "layer " << l << " rank " << rank;
    }
  }
  auto stats = routing_statistics(routing->requests, o.num_experts);
  ASSERT_TRUE(stats.ok());
  const double requested = pi.front() / (double(o.top_k) / o.num_experts);
  for (double ratio : stats->max_over_mean) EXPECT_NEAR(ratio, requested, 0.06 * requested);
}

TEST(SyntheticRouting, SelectionFrequenciesFollowTheRequestedSkew) {
  expect_marginals_match(small_options(), 1.0);
}

TEST(SyntheticRouting, CorrelationKeepsTheMarginals) {
  SyntheticRoutingOptions o = small_options();
  o.token_repeat = 0.4;
  o.layer_follow = 0.3;
  expect_marginals_match(o, 5.0);
}

TEST(SyntheticRouting, TokenRepeatRateMatchesItsExpectation) {
  // Copy with probability a, otherwise an independent draw, whose expected overlap with the
  // previous set is sum_e pi_e^2 (inclusion is independent across draws).
  SyntheticRoutingOptions o = small_options();
  o.token_repeat = 0.5;
  auto routing = generate_synthetic_routing(o);
  ASSERT_TRUE(routing.ok());
  auto stats = routing_statistics(routing->requests, o.num_experts);
  ASSERT_TRUE(stats.ok());
  const auto pi = reference_inclusion(o.num_experts, o.top_k, o.popularity_skew);
  double squares = 0;
  for (double p : pi) squares += p * p;
  const double expected = 0.5 + 0.5 * squares / o.top_k;
  // ~30,000 adjacent pairs; the per-pair overlap lies in [0, 1]: 0.02 is > 5 sigma.
  EXPECT_NEAR(stats->token_repeat_fraction, expected, 0.02);
}

TEST(SyntheticRouting, LayerFollowMapsThePreviousLayerRankForRank) {
  SyntheticRoutingOptions o = small_options();
  o.layer_follow = 0.6;
  auto routing = generate_synthetic_routing(o);
  ASSERT_TRUE(routing.ok());
  const auto& order = routing->expert_at_rank[0];
  // The fixed map: the expert of rank i at layer l-1 goes to the expert of rank i at layer l.
  std::vector<std::vector<int>> map(o.num_moe_layers, std::vector<int>(o.num_experts));
  for (int l = 1; l < o.num_moe_layers; ++l) {
    for (int rank = 0; rank < o.num_experts; ++rank) map[l][order[l - 1][rank]] = order[l][rank];
  }
  double hit = 0, total = 0;
  for (const auto& request : routing->requests) {
    for (int l = 1; l < o.num_moe_layers; ++l) {
      for (int t = 0; t < request.num_tokens(); ++t) {
        const auto now = request.experts(l, t);
        for (uint16_t e : request.experts(l - 1, t)) {
          hit += std::find(now.begin(), now.end(), map[l][e]) != now.end();
          total += 1;
        }
      }
    }
  }
  const auto pi = reference_inclusion(o.num_experts, o.top_k, o.popularity_skew);
  double squares = 0;
  for (double p : pi) squares += p * p;
  EXPECT_NEAR(hit / total, 0.6 + 0.4 * squares / o.top_k, 0.02);
}

TEST(SyntheticRouting, TaskProfilesShiftHotExpertsAndPrefillPredictsDecode) {
  SyntheticRoutingOptions o = small_options();
  o.num_task_profiles = 3;
  o.task_variation = 0.5;
  auto routing = generate_synthetic_routing(o);
  ASSERT_TRUE(routing.ok());
  EXPECT_NE(routing->expert_at_rank[0][0], routing->expert_at_rank[1][0]);
  auto stats = routing_statistics(routing->requests, o.num_experts);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->prefill_decode_top_overlap.size(), 3u);
  // Prefill and decode draw from the same popularity, so the hottest experts coincide far more
  // often than the 5/64 of unrelated top-5 sets (paper 004 Fig. 7b reports 60-90%).
  EXPECT_GT(stats->prefill_decode_top_overlap[2], 0.6);
}

TEST(SyntheticRouting, IsDeterministicAndValidatesOptions) {
  SyntheticRoutingOptions o = small_options();
  o.num_requests = 3;
  auto a = generate_synthetic_routing(o);
  auto b = generate_synthetic_routing(o);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t r = 0; r < a->requests.size(); ++r) {
    EXPECT_EQ(a->requests[r].selections, b->requests[r].selections);
    EXPECT_EQ(a->requests[r].moe_layers, (std::vector<int>{1, 2, 3}));
    // Every row is k distinct experts.
    for (int t = 0; t < a->requests[r].num_tokens(); ++t) {
      auto row = a->requests[r].experts(0, t);
      std::vector<uint16_t> sorted(row.begin(), row.end());
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
    }
  }
  o.token_repeat = 0.7;
  o.layer_follow = 0.5;
  auto bad = generate_synthetic_routing(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer_follow"), std::string::npos);
  o = small_options();
  o.top_k = 100;
  EXPECT_NE(generate_synthetic_routing(o).status().message().find("top_k"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::plan
