// MoE gate: from a token's router logits to its top-k experts and their weights, following
// Hugging Face's MoEGate (modeling_deepseek.py) for DeepSeek-V3 and V2.
//
// V3 (topk_method noaux_tc, sigmoid scores):
//   scores = sigmoid(logits); choice = scores + e_score_correction_bias
//   group score = sum of the top-2 choice values in the group; keep topk_group groups
//   top_k experts by choice among the kept groups
//   weights = scores (the uncorrected ones) of the chosen experts; if norm_topk_prob and
//   top_k > 1: divided by their sum (+1e-20); then times routed_scaling_factor.
//   The bias therefore changes which experts are chosen, never their weights.
// V2: scores = softmax of logits (the config parser refuses sigmoid); greedy = top_k of scores;
//   group_limited_greedy = group score is the group's max score, then top_k within the
//   kept groups; weights = chosen scores, normalised if norm_topk_prob and top_k > 1,
//   otherwise multiplied by routed_scaling_factor (V2 applies the factor only then).
//
// Ties are broken towards the lower index; experts are listed in descending choice order.
// Experts of dropped groups are masked with -inf (DeepSeek's reference inference code)
// rather than 0.0, which only differs when choice values are negative.
#pragma once

#include <cstdint>
#include <span>

#include "model/model_config.h"

namespace peerserve {

// logits: [n_routed_experts] fp32; bias: [n_routed_experts] or empty;
// expert_ids, weights: [num_experts_per_tok] outputs. `scratch` needs 2 * n_routed_experts.
void route_token(const ModelConfig& config, std::span<const float> logits,
                 std::span<const float> bias, std::span<float> scratch,
                 std::span<int32_t> expert_ids, std::span<float> weights);

}  // namespace peerserve
