#include "model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/rotary_embedding.h"

namespace peerserve {
namespace {

// config.json of deepseek-ai/DeepSeek-V3 (auto_map omitted).
constexpr const char* kDeepseekV3Config = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280
})";

// config.json of deepseek-ai/DeepSeek-V2-Lite (auto_map omitted).
constexpr const char* kDeepseekV2LiteConfig = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
  "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
  "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
  "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400
})";

// config.json of moonshotai/Moonlight-16B-A3B (V3 architecture, no q LoRA, no MTP, one group).
constexpr const char* kMoonlightConfig = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 163584,
  "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11264,
  "kv_lora_rank": 512, "max_position_embeddings": 8192, "model_type": "deepseek_v3",
  "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
  "n_shared_experts": 2, "norm_topk_prob": true, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
  "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 50000.0,
  "routed_scaling_factor": 2.446, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.48.0", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 163840
})";

nlohmann::json base_config() {
  return nlohmann::json::parse(kDeepseekV3Config);
}

Status parse_status(const nlohmann::json& j) {
  return parse_model_config(j.dump(), "m/config.json").status();
}

// A config.json nested a million levels deep: refused by its depth before an error message
// prints the value (dump() recursed once per level and overflowed the stack).
TEST(ModelConfigTest, RejectsDeeplyNestedConfigs) {
  const size_t levels = 1000000;
  const std::string deep = std::string(levels, '[') + std::string(levels, ']');
  Result<ModelConfig> r = parse_model_config("{\"architectures\": " + deep + "}", "m/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper than 64 levels"), std::string::npos)
      << r.status().message().substr(0, 200);
}

TEST(ModelConfigTest, ParsesDeepseekV3) {
  Result<ModelConfig> r = parse_model_config(kDeepseekV3Config, "v3/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, ModelArch::kDeepseekV3);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.q_lora_rank, std::optional<int64_t>(1536));
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoAuxTc);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 1.0);
  EXPECT_EQ(c.fp8_block_rows, std::optional<int64_t>(128));
  EXPECT_EQ(c.fp8_block_cols, std::optional<int64_t>(128));
  EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(0));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
}

TEST(ModelConfigTest, ParsesDeepseekV2Lite) {
  Result<ModelConfig> r = parse_model_config(kDeepseekV2LiteConfig, "v2/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, ModelArch::kDeepseekV2);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);  // absent
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale, 0.707);
  EXPECT_FALSE(c.fp8_block_rows.has_value());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{100001});
}

TEST(ModelConfigTest, ParsesMoonlight) {
  Result<ModelConfig> r = parse_model_config(kMoonlightConfig, "moonlight/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, ModelArch::kDeepseekV3);
  EXPECT_FALSE(r->q_lora_rank.has_value());
  EXPECT_FALSE(r->rope_scaling.has_value());
  EXPECT_EQ(r->num_nextn_predict_layers, 0);
  EXPECT_DOUBLE_EQ(r->rope_theta, 50000.0);
}

TEST(ModelConfigTest, GroupLimitedGreedyAndEosList) {
  nlohmann::json j = nlohmann::json::parse(kDeepseekV2LiteConfig);
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 3;
  j["eos_token_id"] = {100001, 100002};
  Result<ModelConfig> r = parse_model_config(j.dump(), "c.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->topk_method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{100001, 100002}));
}

TEST(ModelConfigTest, KimiK2ModelTypeIsV3) {
  nlohmann::json j = base_config();
  j["model_type"] = "kimi_k2";
  Result<ModelConfig> r = parse_model_config(j.dump(), "c.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, ModelArch::kDeepseekV3);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  for (const char* text : {kDeepseekV3Config, kDeepseekV2LiteConfig, kMoonlightConfig}) {
    const ModelConfig a = *parse_model_config(text, "a.json");
    Result<ModelConfig> b = parse_model_config(model_config_to_json(a), "b.json");
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(model_config_to_json(a), model_config_to_json(*b));
    EXPECT_EQ(b->arch, a.arch);
    EXPECT_EQ(b->q_lora_rank, a.q_lora_rank);
    EXPECT_EQ(b->rope_scaling.has_value(), a.rope_scaling.has_value());
    EXPECT_EQ(b->fp8_block_rows, a.fp8_block_rows);
    EXPECT_EQ(b->topk_method, a.topk_method);
  }
}

// Every rejection names the offending field.
struct BadField {
  const char* field;
  nlohmann::json value;  // null json = remove the field
  StatusCode code;
};

class ModelConfigErrorTest : public ::testing::TestWithParam<BadField> {};

TEST_P(ModelConfigErrorTest, NamesTheField) {
  const BadField& bad = GetParam();
  nlohmann::json j = base_config();
  const std::string key = bad.field;
  const size_t dot = key.find('.');
  if (dot != std::string::npos) {
    j[key.substr(0, dot)][key.substr(dot + 1)] = bad.value;
  } else if (bad.value.is_null()) {
    j.erase(key);
  } else {
    j[key] = bad.value;
  }
  const Status s = parse_status(j);
  ASSERT_FALSE(s.ok()) << bad.field;
  EXPECT_EQ(s.code(), bad.code) << s.to_string();
  EXPECT_NE(s.message().find("m/config.json"), std::string::npos) << s.message();
  const std::string last = key.substr(dot == std::string::npos ? 0 : dot + 1);
  EXPECT_NE(s.message().find(last), std::string::npos) << s.message();
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ModelConfigErrorTest,
    ::testing::Values(
        BadField{"architectures", {"LlamaForCausalLM"}, StatusCode::kUnimplemented},
        BadField{"model_type", "llama", StatusCode::kUnimplemented},
        BadField{"model_type", "deepseek_v2", StatusCode::kInvalidArgument},  // mismatch
        BadField{"hidden_size", nullptr, StatusCode::kInvalidArgument},       // missing
        BadField{"hidden_size", 0, StatusCode::kInvalidArgument},
        BadField{"hidden_size", "7168", StatusCode::kInvalidArgument},
        BadField{"num_hidden_layers", -1, StatusCode::kInvalidArgument},
        BadField{"qk_rope_head_dim", 63, StatusCode::kInvalidArgument},
        BadField{"qk_rope_head_dim", 514, StatusCode::kInvalidArgument},  // aborted the forward
        BadField{"n_group", 7, StatusCode::kInvalidArgument},             // 256 % 7 != 0
        BadField{"topk_group", 9, StatusCode::kInvalidArgument},
        BadField{"num_experts_per_tok", 300, StatusCode::kInvalidArgument},
        BadField{"first_k_dense_replace", 62, StatusCode::kInvalidArgument},
        BadField{"scoring_func", "softmax", StatusCode::kUnimplemented},
        BadField{"topk_method", "greedy", StatusCode::kUnimplemented},
        BadField{"hidden_act", "gelu", StatusCode::kUnimplemented},
        BadField{"rms_norm_eps", 0, StatusCode::kInvalidArgument},
        BadField{"eos_token_id", 200000, StatusCode::kInvalidArgument},
        BadField{"rope_scaling.type", "linear", StatusCode::kUnimplemented},
        BadField{"rope_scaling.beta_fast", 0, StatusCode::kInvalidArgument},  // NaN frequencies
        BadField{"rope_scaling.beta_slow", 0, StatusCode::kInvalidArgument},
        // Each accepted before, each giving NaN (or all-zero) logits: bounded now.
        BadField{"rope_theta", 1, StatusCode::kInvalidArgument},
        BadField{"rope_theta", 1e-308, StatusCode::kInvalidArgument},
        BadField{"rope_scaling.mscale", 1e20, StatusCode::kInvalidArgument},
        BadField{"rope_scaling.mscale_all_dim", 1e308, StatusCode::kInvalidArgument},
        BadField{"rope_scaling.factor", 1e7, StatusCode::kInvalidArgument},
        BadField{"rope_scaling.beta_fast", 1e7, StatusCode::kInvalidArgument},
        BadField{"routed_scaling_factor", 1e39, StatusCode::kInvalidArgument},
        BadField{"rms_norm_eps", 1e308, StatusCode::kInvalidArgument},
        BadField{"rope_interleave", false, StatusCode::kUnimplemented},  // was ignored
        BadField{"topk_group", nlohmann::json::object(), StatusCode::kInvalidArgument},
        BadField{"quantization_config.quant_method", "gptq", StatusCode::kUnimplemented},
        BadField{"quantization_config.fmt", "e5m2", StatusCode::kUnimplemented},
        BadField{"quantization_config.weight_block_size", {128}, StatusCode::kInvalidArgument},
        BadField{"quantization_config.weight_block_size", {128, 0}, StatusCode::kInvalidArgument},
        // Each field within its own bound, the weights they shape too large (products that
        // overflowed int64 before they were checked).
        BadField{"num_attention_heads", int64_t{1} << 40, StatusCode::kInvalidArgument},
        BadField{"qk_nope_head_dim", int64_t{1} << 39, StatusCode::kInvalidArgument},
        BadField{"vocab_size", int64_t{1} << 30, StatusCode::kInvalidArgument},
        BadField{"hidden_size", int64_t{1} << 40, StatusCode::kInvalidArgument},
        BadField{"num_hidden_layers", 5000, StatusCode::kInvalidArgument},
        BadField{"n_routed_experts", int64_t{1} << 20, StatusCode::kInvalidArgument},
        // 62 layers x 8192 experts: each bound alone held, the tensor list did not (quantize
        // ran out of memory listing 1,024 x 65,536 experts).
        BadField{"n_routed_experts", 8192, StatusCode::kInvalidArgument}));

// n_group past the router's 1024 groups aborted the first forward; a V3 config without
// n_group / topk_group takes Hugging Face's defaults (8 and 4), not one group.
TEST(ModelConfigTest, ExpertGroupsAreBoundedAndDefaultAsInHuggingFace) {
  nlohmann::json j = base_config();
  j["n_routed_experts"] = 2048;
  j["n_group"] = 2048;
  j["topk_group"] = 2;
  j["num_experts_per_tok"] = 2;
  const Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_group"), std::string::npos) << s.message();
  nlohmann::json defaults = base_config();
  defaults.erase("n_group");
  defaults.erase("topk_group");
  Result<ModelConfig> c = parse_model_config(defaults.dump(), "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->n_group, 8);
  EXPECT_EQ(c->topk_group, 4);
}

// transformers 5 writes rope_parameters in place of rope_scaling and rope_theta; both are read
// as it reads them (rope_scaling first, a rope_theta inside over the top-level one). They were
// ignored: plain RoPE at theta 10000, and a softmax scale without YaRN's mscale.
TEST(ModelConfigTest, RopeParametersAsTransformers5WritesThem) {
  const ModelConfig legacy = *parse_model_config(kDeepseekV3Config, "a.json");
  nlohmann::json j = base_config();
  nlohmann::json rope = j["rope_scaling"];
  rope.erase("type");
  rope["rope_type"] = "yarn";
  rope["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = rope;
  Result<ModelConfig> r = parse_model_config(j.dump(), "m/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(r->rope_scaling.has_value());
  EXPECT_EQ(model_config_to_json(*r), model_config_to_json(legacy));

  // rope_theta inside the object wins; "default" is plain RoPE.
  j["rope_theta"] = 1234.0;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  r = parse_model_config(j.dump(), "m/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->rope_scaling.has_value());
  EXPECT_EQ(r->rope_theta, 50000.0);

  // rope_scaling, when set, is read before rope_parameters (transformers 5 does the same).
  j["rope_scaling"] = base_config()["rope_scaling"];
  r = parse_model_config(j.dump(), "m/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->rope_scaling.has_value());

  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  const Status s = parse_status(j);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  EXPECT_NE(s.message().find("rope_parameters.rope_type"), std::string::npos) << s.message();
}

// Absent fields take Hugging Face's defaults; a null topk_group with several groups, on which
// the reference code fails, is refused (it was read as 1).
TEST(ModelConfigTest, DefaultsAndNullsAsInHuggingFace) {
  nlohmann::json j = base_config();
  j.erase("max_position_embeddings");
  EXPECT_EQ(parse_model_config(j.dump(), "m/config.json")->max_position_embeddings, 4096);
  nlohmann::json v2 = nlohmann::json::parse(kDeepseekV2LiteConfig);
  v2.erase("max_position_embeddings");
  EXPECT_EQ(parse_model_config(v2.dump(), "m/config.json")->max_position_embeddings, 2048);
  j = base_config();
  j["topk_group"] = nullptr;
  Status s = parse_status(j);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("topk_group"), std::string::npos) << s.message();
  j = base_config();
  j["hidden_act"] = nullptr;
  s = parse_status(j);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

TEST(ModelConfigTest, RejectsBadJson) {
  const Status s = parse_model_config("{\"hidden_size\": 12,", "x/config.json").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x/config.json: not valid JSON"), std::string::npos) << s.message();
  EXPECT_FALSE(parse_model_config("[1, 2]", "x").ok());
  EXPECT_FALSE(parse_model_config("", "x").ok());
  // A number beyond a double: nlohmann's out_of_range, not parse_error (found by the fuzzer).
  const Status huge = parse_model_config("{\"hidden_size\": 9E999999999}", "x").status();
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument) << huge.message();
}

// Fields each within its bound whose combination leaves YaRN's ramp without a width: the
// frequencies are still finite (HF widens an empty ramp by 0.001, and so do we); the check
// of the derived values accepts them and refuses none of the shipped configs.
TEST(ModelConfigTest, RopeValuesAreCheckedAfterTheFields) {
  nlohmann::json j = base_config();
  j["rope_scaling"]["beta_fast"] = 1e-300;
  j["rope_scaling"]["beta_slow"] = 1e-300;
  Result<ModelConfig> tiny_betas = parse_model_config(j.dump(), "m/config.json");
  ASSERT_TRUE(tiny_betas.ok()) << tiny_betas.status().to_string();
  EXPECT_TRUE(check_rope_values(*tiny_betas).ok());
  const RotaryEmbedding rope(*tiny_betas);
  for (float f : rope.inv_freq()) EXPECT_TRUE(std::isfinite(f));
  // A config built in code skips the parser's bounds; the check still names the fields.
  ModelConfig bad = *tiny_betas;
  bad.rope_theta = 1.0;
  const Status s = check_rope_values(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rope_theta 1 with YaRN factor"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected a finite positive number"), std::string::npos)
      << s.message();
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  const Status s = load_model_config("/nonexistent/config.json").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/config.json"), std::string::npos);
}

}  // namespace
}  // namespace peerserve
