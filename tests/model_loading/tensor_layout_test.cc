#include "model/checkpoint/tensor_layout.h"

#include <gtest/gtest.h>

#include <map>

namespace peerserve {
namespace {

std::map<std::string, std::vector<int64_t>> shapes_of(const ModelConfig& config) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
    EXPECT_TRUE(out.emplace(spec.name, spec.shape).second) << "duplicate " << spec.name;
  }
  return out;
}

// Names and shapes as they appear in deepseek-ai/DeepSeek-V3's model.safetensors.index.json
// and safetensors headers.
TEST(TensorLayoutTest, DeepseekV3NamesAndShapes) {
  const ModelConfig v3;  // defaults are DeepSeek-V3's
  const auto shapes = shapes_of(v3);
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"model.embed_tokens.weight", {129280, 7168}},
      {"model.layers.0.input_layernorm.weight", {7168}},
      {"model.layers.0.self_attn.q_a_proj.weight", {1536, 7168}},
      {"model.layers.0.self_attn.q_a_layernorm.weight", {1536}},
      {"model.layers.0.self_attn.q_b_proj.weight", {24576, 1536}},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {576, 7168}},
      {"model.layers.0.self_attn.kv_a_layernorm.weight", {512}},
      {"model.layers.0.self_attn.kv_b_proj.weight", {32768, 512}},
      {"model.layers.0.self_attn.o_proj.weight", {7168, 16384}},
      {"model.layers.0.mlp.gate_proj.weight", {18432, 7168}},
      {"model.layers.2.mlp.down_proj.weight", {7168, 18432}},
      {"model.layers.3.mlp.gate.weight", {256, 7168}},
      {"model.layers.3.mlp.gate.e_score_correction_bias", {256}},
      {"model.layers.3.mlp.experts.255.up_proj.weight", {2048, 7168}},
      {"model.layers.60.mlp.experts.0.down_proj.weight", {7168, 2048}},
      {"model.layers.3.mlp.shared_experts.gate_proj.weight", {2048, 7168}},
      {"model.norm.weight", {7168}},
      {"lm_head.weight", {129280, 7168}},
      {"model.layers.61.embed_tokens.weight", {129280, 7168}},
      {"model.layers.61.enorm.weight", {7168}},
      {"model.layers.61.hnorm.weight", {7168}},
      {"model.layers.61.eh_proj.weight", {7168, 14336}},
      {"model.layers.61.shared_head.norm.weight", {7168}},
      {"model.layers.61.shared_head.head.weight", {129280, 7168}},
      {"model.layers.61.mlp.experts.17.gate_proj.weight", {2048, 7168}},
      {"model.layers.61.self_attn.kv_b_proj.weight", {32768, 512}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.contains(name)) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  EXPECT_FALSE(shapes.contains("model.layers.2.mlp.gate.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.62.enorm.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.0.self_attn.q_proj.weight"));
  // 3 dense layers x 12 + 59 MoE layers (incl. MTP) x (9 + 2 + 256 x 3 + 3) + 3 + 6 MTP extras.
  EXPECT_EQ(shapes.size(), 3u * 12 + 59u * 782 + 3 + 6);
}

TEST(TensorLayoutTest, DeepseekV2LiteNamesAndShapes) {
  ModelConfig c;
  c.arch = ModelArch::kDeepseekV2;
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_nextn_predict_layers = 0;
  c.num_attention_heads = 16;
  c.n_shared_experts = 2;
  c.n_routed_experts = 64;
  c.first_k_dense_replace = 1;
  c.q_lora_rank = std::nullopt;
  const auto shapes = shapes_of(c);
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"),
            (std::vector<int64_t>{3072, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{10944, 2048}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.shared_experts.gate_proj.weight"),
            (std::vector<int64_t>{2816, 2048}));
  EXPECT_EQ(shapes.at("model.layers.26.mlp.experts.63.down_proj.weight"),
            (std::vector<int64_t>{2048, 1408}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.gate.weight"), (std::vector<int64_t>{64, 2048}));
  EXPECT_FALSE(shapes.contains("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(shapes.contains("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.27.enorm.weight"));
}

TEST(TensorLayoutTest, TiedEmbeddingsHaveNoLmHead) {
  ModelConfig c;
  c.num_hidden_layers = 4;
  c.tie_word_embeddings = true;
  EXPECT_FALSE(shapes_of(c).contains("lm_head.weight"));
  EXPECT_EQ(fp8_scale_inv_name("a.weight"), "a.weight_scale_inv");
}

}  // namespace
}  // namespace peerserve
