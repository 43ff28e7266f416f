#include "model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace peerserve {
namespace {

// Index of the largest value among values[i] where allowed(i), lowest index on ties.
template <typename Allowed>
int64_t arg_max(std::span<const float> values, Allowed allowed) {
  int64_t best = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    if (!allowed(i)) continue;
    if (best < 0 || values[i] > values[best]) best = i;
  }
  return best;
}

}  // namespace

void route_token(const ModelConfig& config, std::span<const float> logits,
                 std::span<const float> bias, std::span<float> scratch,
                 std::span<int32_t> expert_ids, std::span<float> weights) {
  const int64_t n = config.n_routed_experts;
  const int64_t top_k = config.num_experts_per_tok;
  PS_CHECK_EQ(static_cast<int64_t>(logits.size()), n);
  PS_CHECK(static_cast<int64_t>(scratch.size()) >= 2 * n);
  PS_CHECK_EQ(static_cast<int64_t>(expert_ids.size()), top_k);
  PS_CHECK_EQ(static_cast<int64_t>(weights.size()), top_k);
  PS_CHECK(top_k <= n);
  std::span<float> scores = scratch.subspan(0, n);
  std::span<float> choice = scratch.subspan(n, n);

  if (config.scoring_func == ScoringFunc::kSigmoid) {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    const float max = *std::max_element(logits.begin(), logits.end());
    float sum = 0.0f;
    for (int64_t e = 0; e < n; ++e) sum += scores[e] = std::exp(logits[e] - max);
    for (int64_t e = 0; e < n; ++e) scores[e] /= sum;
  }
  const bool use_bias = config.topk_method == TopkMethod::kNoAuxTc && !bias.empty();
  for (int64_t e = 0; e < n; ++e) choice[e] = use_bias ? scores[e] + bias[e] : scores[e];

  // Group-limited selection: mask the experts of all but the best topk_group groups.
  const bool grouped = config.topk_method != TopkMethod::kGreedy && config.n_group > 1 &&
                       config.topk_group < config.n_group;
  if (grouped) {
    const int64_t groups = config.n_group, per_group = n / config.n_group;
    float group_score[1024];
    PS_CHECK_LE(groups, 1024);
    for (int64_t g = 0; g < groups; ++g) {
      std::span<const float> members(choice.data() + g * per_group, per_group);
      if (config.topk_method == TopkMethod::kNoAuxTc) {
        // Sum of the two best members (the single member if the group has one).
        const int64_t first = arg_max(members, [](int64_t) { return true; });
        const int64_t second = arg_max(members, [&](int64_t i) { return i != first; });
        group_score[g] = members[first] + (second >= 0 ? members[second] : 0.0f);
      } else {
        group_score[g] = *std::max_element(members.begin(), members.end());
      }
    }
    bool kept[1024] = {};
    std::span<const float> group_span(group_score, groups);
    for (int64_t k = 0; k < config.topk_group; ++k) {
      kept[arg_max(group_span, [&](int64_t g) { return !kept[g]; })] = true;
    }
    for (int64_t e = 0; e < n; ++e) {
      if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
    }
  }

  // Top-k by choice, descending, the lower index first on ties: one pass that keeps the best
  // k so far in order (a new expert enters only if strictly better than the k-th, and moves
  // up only past strictly worse ones). A repeated arg-max was O(k^2 n) per token.
  int64_t count = 0;
  for (int64_t e = 0; e < n; ++e) {
    const float v = choice[e];
    if (count == top_k && !(v > choice[expert_ids[top_k - 1]])) continue;
    int64_t pos = count < top_k ? count++ : top_k - 1;
    for (; pos > 0 && v > choice[expert_ids[pos - 1]]; --pos) expert_ids[pos] = expert_ids[pos - 1];
    expert_ids[pos] = static_cast<int32_t>(e);
  }
  for (int64_t k = 0; k < top_k; ++k) weights[k] = scores[expert_ids[k]];

  const bool normalise = top_k > 1 && config.norm_topk_prob;
  if (normalise) {
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) sum += weights[k];
    sum += 1e-20f;
    for (int64_t k = 0; k < top_k; ++k) weights[k] /= sum;
  }
  // V3 always scales; V2 scales only when it does not normalise.
  if (config.arch == ModelArch::kDeepseekV3 || !normalise) {
    const float factor = static_cast<float>(config.routed_scaling_factor);
    for (int64_t k = 0; k < top_k; ++k) weights[k] *= factor;
  }
}

}  // namespace peerserve
