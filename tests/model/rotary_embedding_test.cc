// YaRN rotary tables and the softmax scale against a numpy transcription of Hugging Face's
// DeepseekV3YarnRotaryEmbedding (hf_reference.py); the rotation against HF's
// permute-then-rotate_half written out as plain loops.
#include "model/rotary_embedding.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/hf_reference.h"

namespace peerserve {
namespace {

nlohmann::json yarn_request(const ModelConfig& c, const std::vector<int64_t>& positions) {
  nlohmann::json cfg = {
      {"dim", c.qk_rope_head_dim}, {"base", c.rope_theta}, {"qk_head_dim", c.qk_head_dim()}};
  if (c.rope_scaling) {
    cfg["factor"] = c.rope_scaling->factor;
    cfg["original_max_position_embeddings"] = c.rope_scaling->original_max_position_embeddings;
    cfg["beta_fast"] = c.rope_scaling->beta_fast;
    cfg["beta_slow"] = c.rope_scaling->beta_slow;
    cfg["mscale"] = c.rope_scaling->mscale;
    cfg["mscale_all_dim"] = c.rope_scaling->mscale_all_dim;
  }
  return {{"op", "yarn"}, {"config", cfg}, {"positions", positions}};
}

void expect_tables_match(const ModelConfig& c) {
  const std::vector<int64_t> positions = {0, 1, 7, 100, 4095, 40000, 163839};
  const nlohmann::json ref = testing::run_hf_reference(yarn_request(c, positions));
  RotaryEmbedding rope(c);
  const auto inv_freq = ref["inv_freq"].get<std::vector<float>>();
  ASSERT_EQ(rope.inv_freq().size(), inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    // numpy's float32 pow vs our double pow rounded once: at most one ulp.
    EXPECT_NEAR(rope.inv_freq()[i], inv_freq[i], 2e-7 * inv_freq[i]) << "i " << i;
  }
  EXPECT_NEAR(rope.mscale(), ref["mscale"].get<double>(), 1e-7);
  EXPECT_NEAR(mla_softmax_scale(c), ref["softmax_scale"].get<double>(), 1e-15);
  std::vector<float> cos(c.qk_rope_head_dim / 2), sin(c.qk_rope_head_dim / 2);
  for (size_t p = 0; p < positions.size(); ++p) {
    rope.cos_sin(positions[p], cos.data(), sin.data());
    const auto rc = ref["cos"][p].get<std::vector<float>>();
    const auto rs = ref["sin"][p].get<std::vector<float>>();
    for (size_t i = 0; i < cos.size(); ++i) {
      // Both take the angle pos * inv_freq in fp32. inv_freq may differ by an ulp (float32
      // pow vs double pow rounded once), which moves the angle by pos * 6e-8 * inv_freq, and
      // the product's own rounding adds up to an ulp of the angle: 4 * 6e-8 of the angle
      // covers both (that is 3e-3 at position 163839 for the fastest frequencies, ~1e-6
      // for positions below 10).
      const double angle = static_cast<double>(positions[p]) * inv_freq[i];
      const double tol = 2e-6 + 2.4e-7 * angle;
      EXPECT_NEAR(cos[i], rc[i], tol) << "pos " << positions[p] << " i " << i;
      EXPECT_NEAR(sin[i], rs[i], tol) << "pos " << positions[p] << " i " << i;
    }
  }
}

TEST(RotaryEmbeddingTest, DeepSeekV3YarnMatchesHuggingFace) {
  ModelConfig c;  // V3 defaults: rope dim 64, theta 10000, YaRN factor 40 from 4096
  c.rope_scaling = YarnScaling{};
  expect_tables_match(c);
  // mscale_all_dim = mscale = 1: cos/sin unscaled, softmax scale times (0.1 ln 40 + 1)^2.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(mla_softmax_scale(c), m * m / std::sqrt(192.0), 1e-15);
  EXPECT_NEAR(yarn_get_mscale(40.0, 0.707), 0.0707 * std::log(40.0) + 1.0, 1e-15);
  EXPECT_EQ(yarn_get_mscale(1.0, 5.0), 1.0);
}

TEST(RotaryEmbeddingTest, UnequalMscalesAndPlainRopeMatchHuggingFace) {
  ModelConfig c;
  c.qk_rope_head_dim = 8;
  c.rope_scaling = YarnScaling{.factor = 4.0,
                               .original_max_position_embeddings = 1024,
                               .beta_fast = 32.0,
                               .beta_slow = 1.0,
                               .mscale = 0.707,
                               .mscale_all_dim = 0.5};
  expect_tables_match(c);
  c.rope_scaling.reset();
  expect_tables_match(c);
  EXPECT_NEAR(mla_softmax_scale(c), 1.0 / std::sqrt(136.0), 1e-15);
}

TEST(RotaryEmbeddingTest, RotatesInterleavedPairsIntoHalvesOrder) {
  ModelConfig c;
  c.qk_rope_head_dim = 8;
  RotaryEmbedding rope(c);
  const float x[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f};
  float cos[4], sin[4];
  rope.cos_sin(3, cos, sin);
  // HF: q.view(d/2, 2).transpose -> [x0 x2 x4 x6 | x1 x3 x5 x7]; q*cos + rotate_half(q)*sin
  // with rotate_half(h) = [-h_second | h_first] and cos/sin repeated over both halves.
  float halves[8], expected[8];
  for (int i = 0; i < 4; ++i) {
    halves[i] = x[2 * i];
    halves[4 + i] = x[2 * i + 1];
  }
  for (int i = 0; i < 8; ++i) {
    const float rotated = i < 4 ? -halves[i + 4] : halves[i - 4];
    expected[i] = halves[i] * cos[i % 4] + rotated * sin[i % 4];
  }
  float y[8];
  std::copy(x, x + 8, y);
  rope.rotate(cos, sin, y);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(y[i], expected[i]) << i;
}

}  // namespace
}  // namespace peerserve
