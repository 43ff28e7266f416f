// Synthetic expert-routing traces with controllable popularity skew and adjacent-token and
// adjacent-layer correlation, in the RequestRouting form of the published traces.
//
// Popularity: at every MoE layer the experts are ranked by a random per-layer permutation and
// expert of rank i (0-based) is selected by a token with probability pi_i, where pi is Zipf
// (weight 1/(i+1)^s) scaled to sum to top_k and capped at 1 (water-filling). Each token's
// top-k set is drawn by randomized systematic sampling, which hits these inclusion
// probabilities exactly with k distinct experts.
// Correlation (paper 004 Ob1/Ob2): with probability token_repeat a token re-selects the
// previous token's set at the same layer; otherwise with probability layer_follow it takes
// its own previous-layer set mapped rank-for-rank onto this layer (a fixed expert->expert map
// per layer, the "white dots" of the cross-layer heatmaps); otherwise it draws afresh. Every
// branch has the same marginal, so the skew is exactly the requested one.
// Task profiles (Ob4, Insight 6): each request follows one of num_task_profiles popularity
// orders; profile p > 0 reshuffles a task_variation fraction of profile 0's ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "plan/placement/routing_trace.h"

namespace peerserve::plan {

struct SyntheticRoutingOptions {
  int num_experts = 256;     // routed experts per MoE layer (DeepSeek-V3: 256)
  int top_k = 8;             // DeepSeek-V3: 8
  int num_dense_layers = 3;  // leading decoder layers without a router (DeepSeek-V3: 3)
  int num_moe_layers = 58;   // DeepSeek-V3: 58
  int num_requests = 32;
  int min_prefill_tokens = 16;  // prompt lengths are uniform on [min, max]
  int max_prefill_tokens = 256;
  int decode_steps = 128;        // the published traces stop at 128 decode steps
  double popularity_skew = 1.0;  // Zipf exponent s; 0 = uniform
  double token_repeat = 0.0;     // in [0, 1]
  double layer_follow = 0.0;     // in [0, 1]; token_repeat + layer_follow <= 1
  int num_task_profiles = 1;
  double task_variation = 0.0;  // in [0, 1]
  uint64_t seed = 1;

  Status validate() const;
};

// The inclusion probability of the expert of each popularity rank (descending, sums to top_k,
// each <= 1). REQUIRES: 1 <= top_k <= num_experts, skew >= 0.
std::vector<double> zipf_inclusion_probabilities(int num_experts, int top_k, double skew);

// The Zipf exponent whose hottest expert is selected `max_over_mean` times as often as the
// average expert (top_k/num_experts). Fails if the target is not in [1, num_experts/top_k].
Result<double> zipf_skew_for_max_over_mean(int num_experts, int top_k, double max_over_mean);

struct SyntheticRouting {
  std::vector<RequestRouting> requests;
  // [profile][moe layer][rank] -> expert: which expert holds each popularity rank.
  std::vector<std::vector<std::vector<uint16_t>>> expert_at_rank;
  std::vector<int> request_profile;  // profile of each request
};

Result<SyntheticRouting> generate_synthetic_routing(const SyntheticRoutingOptions& options);

}  // namespace peerserve::plan
