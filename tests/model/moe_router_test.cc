// route_token against a numpy transcription of Hugging Face's MoEGate (hf_reference.py),
// plus constructed cases for the correction bias and the V2 scaling rule.
#include "model/moe_router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/model/hf_reference.h"

namespace peerserve {
namespace {

ModelConfig router_config(ModelArch arch, int64_t experts, int64_t groups, int64_t topk_group,
                          int64_t top_k, ScoringFunc scoring, TopkMethod method, bool norm,
                          double factor) {
  ModelConfig c;
  c.arch = arch;
  c.n_routed_experts = experts;
  c.n_group = groups;
  c.topk_group = topk_group;
  c.num_experts_per_tok = top_k;
  c.scoring_func = scoring;
  c.topk_method = method;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = factor;
  return c;
}

nlohmann::json to_json(const ModelConfig& c) {
  return {{"arch", c.arch == ModelArch::kDeepseekV3 ? "v3" : "v2"},
          {"scoring_func", c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax"},
          {"topk_method", c.topk_method == TopkMethod::kNoAuxTc  ? "noaux_tc"
                          : c.topk_method == TopkMethod::kGreedy ? "greedy"
                                                                 : "group_limited_greedy"},
          {"n_group", c.n_group},
          {"topk_group", c.topk_group},
          {"top_k", c.num_experts_per_tok},
          {"norm_topk_prob", c.norm_topk_prob},
          {"routed_scaling_factor", c.routed_scaling_factor}};
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const ModelConfig& c, const std::vector<float>& logits,
             const std::vector<float>& bias) {
  Routed r{std::vector<int32_t>(c.num_experts_per_tok), std::vector<float>(c.num_experts_per_tok)};
  std::vector<float> scratch(2 * c.n_routed_experts);
  route_token(c, logits, bias, scratch, r.ids, r.weights);
  return r;
}

TEST(MoeRouterTest, MatchesHuggingFaceMoEGate) {
  const std::vector<ModelConfig> configs = {
      // DeepSeek-V3 itself and the tiny preset's shape.
      router_config(ModelArch::kDeepseekV3, 256, 8, 4, 8, ScoringFunc::kSigmoid,
                    TopkMethod::kNoAuxTc, true, 2.5),
      router_config(ModelArch::kDeepseekV3, 8, 4, 2, 2, ScoringFunc::kSigmoid, TopkMethod::kNoAuxTc,
                    true, 2.5),
      // DeepSeek-V2 (group-limited, no normalisation, factor 16) and V2-Lite (greedy).
      router_config(ModelArch::kDeepseekV2, 160, 8, 3, 6, ScoringFunc::kSoftmax,
                    TopkMethod::kGroupLimitedGreedy, false, 16.0),
      router_config(ModelArch::kDeepseekV2, 64, 1, 1, 6, ScoringFunc::kSoftmax, TopkMethod::kGreedy,
                    false, 1.0),
      router_config(ModelArch::kDeepseekV2, 64, 1, 1, 6, ScoringFunc::kSoftmax, TopkMethod::kGreedy,
                    true, 1.0),
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ModelConfig& c : configs) {
    const int64_t tokens = 64;
    std::vector<std::vector<float>> logits(tokens, std::vector<float>(c.n_routed_experts));
    for (auto& row : logits) {
      for (float& v : row) v = normal(rng);
    }
    std::vector<float> bias;
    if (c.topk_method == TopkMethod::kNoAuxTc) {
      for (int64_t e = 0; e < c.n_routed_experts; ++e) bias.push_back(0.1f * normal(rng));
    }
    nlohmann::json request = {{"op", "gate"}, {"config", to_json(c)}, {"logits", logits}};
    request["bias"] = bias.empty() ? nlohmann::json(nullptr) : nlohmann::json(bias);
    const nlohmann::json answer = testing::run_hf_reference(request);
    for (int64_t t = 0; t < tokens; ++t) {
      const Routed r = route(c, logits[t], bias);
      EXPECT_EQ(r.ids, answer["ids"][t].get<std::vector<int32_t>>()) << "token " << t;
      const auto expected = answer["weights"][t].get<std::vector<float>>();
      for (int64_t k = 0; k < c.num_experts_per_tok; ++k) {
        // fp32 sigmoid/softmax and a normalising sum: a few ulps.
        EXPECT_NEAR(r.weights[k], expected[k], 1e-6 * std::abs(expected[k]) + 1e-7);
      }
    }
  }
}

TEST(MoeRouterTest, CorrectionBiasChangesSelectionButNotWeights) {
  // One group of 8 experts, top 2, sigmoid scores, normalised, factor 2.5.
  const ModelConfig c = router_config(ModelArch::kDeepseekV3, 8, 1, 1, 2, ScoringFunc::kSigmoid,
                                      TopkMethod::kNoAuxTc, true, 2.5);
  const std::vector<float> logits = {2.0f, 1.5f, 0.1f, -0.3f, 1.0f, 0.2f, -1.0f, 0.0f};
  auto sigmoid = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };

  const Routed plain = route(c, logits, std::vector<float>(8, 0.0f));
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1}));

  // A bias that lifts expert 4 above expert 1 (but not above 0).
  std::vector<float> bias(8, 0.0f);
  bias[4] = 0.1f;
  const Routed biased = route(c, logits, bias);
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{0, 4}));
  // Weights come from the uncorrected sigmoid scores, normalised then scaled.
  const float s0 = sigmoid(2.0f), s4 = sigmoid(1.0f);
  EXPECT_NEAR(biased.weights[0], s0 / (s0 + s4) * 2.5f, 1e-6);
  EXPECT_NEAR(biased.weights[1], s4 / (s0 + s4) * 2.5f, 1e-6);

  // A different bias with the same selection gives bitwise the same weights.
  bias[4] = 0.9f;
  bias[7] = -0.5f;
  const Routed biased2 = route(c, logits, bias);
  EXPECT_EQ(biased2.ids, (std::vector<int32_t>{4, 0}));  // order follows the corrected score
  EXPECT_EQ(biased2.weights[0], biased.weights[1]);
  EXPECT_EQ(biased2.weights[1], biased.weights[0]);
}

TEST(MoeRouterTest, GroupScoreIsSumOfTopTwoInV3AndMaxInV2) {
  // 2 groups of 4 experts, keep 1 group, top 1. Group 0 has one strong expert; group 1 has
  // two good ones whose sum beats it, while its max does not.
  const std::vector<float> logits = {3.0f, -4.0f, -4.0f, -4.0f, 1.5f, 1.4f, -4.0f, -4.0f};
  const ModelConfig v3 = router_config(ModelArch::kDeepseekV3, 8, 2, 1, 1, ScoringFunc::kSigmoid,
                                       TopkMethod::kNoAuxTc, false, 1.0);
  EXPECT_EQ(route(v3, logits, std::vector<float>(8, 0.0f)).ids, (std::vector<int32_t>{4}));
  const ModelConfig v2 = router_config(ModelArch::kDeepseekV2, 8, 2, 1, 1, ScoringFunc::kSigmoid,
                                       TopkMethod::kGroupLimitedGreedy, false, 1.0);
  EXPECT_EQ(route(v2, logits, {}).ids, (std::vector<int32_t>{0}));
}

// The documented order: descending choice, the lower index first among equal values
// (including the -inf of masked groups when fewer finite experts remain than top_k).
TEST(MoeRouterTest, TiesGoToTheLowerIndex) {
  const ModelConfig greedy = router_config(ModelArch::kDeepseekV2, 8, 1, 1, 4,
                                           ScoringFunc::kSoftmax, TopkMethod::kGreedy, true, 1.0);
  EXPECT_EQ(route(greedy, std::vector<float>(8, 0.25f), {}).ids,
            (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(route(greedy, {0.0f, 1.0f, 0.0f, 1.0f, 2.0f, 1.0f, 0.0f, 2.0f}, {}).ids,
            (std::vector<int32_t>{4, 7, 1, 3}));
  // 4 groups of 2, keep 1, top 3: the kept group has two experts, the third pick is the
  // lowest-index masked one.
  const ModelConfig grouped = router_config(ModelArch::kDeepseekV3, 8, 4, 1, 3,
                                            ScoringFunc::kSigmoid, TopkMethod::kNoAuxTc, true, 1.0);
  EXPECT_EQ(
      route(grouped, {0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 2.0f, 0.0f, 0.0f}, std::vector<float>(8, 0.0f))
          .ids,
      (std::vector<int32_t>{4, 5, 0}));
}

TEST(MoeRouterTest, V2ScalesOnlyWithoutNormalisation) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f};
  ModelConfig c = router_config(ModelArch::kDeepseekV2, 4, 1, 1, 2, ScoringFunc::kSoftmax,
                                TopkMethod::kGreedy, true, 16.0);
  Routed r = route(c, logits, {});
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6);  // normalised, not scaled
  c.norm_topk_prob = false;
  r = route(c, logits, {});
  const float z = std::exp(1.0f) + std::exp(0.5f) + std::exp(0.0f) + std::exp(-0.5f);
  EXPECT_NEAR(r.weights[0], std::exp(1.0f) / z * 16.0f, 1e-5);
}

}  // namespace
}  // namespace peerserve
