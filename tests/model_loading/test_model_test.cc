#include "model/checkpoint/test_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/deterministic_normal.h"
#include "model/checkpoint/fp8_block_scaling.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_tokenizer.h"
#include "tensor/float_convert.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve {
namespace {

using testing::ScratchDir;

std::map<std::string, std::string> read_all_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files[entry.path().filename().string()] = testing::read_file_bytes(entry.path().string());
  }
  return files;
}

uint64_t fnv1a64(const std::map<std::string, std::string>& files) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, bytes] : files) {
    for (const std::string* s : {&name, &bytes}) {
      for (unsigned char c : *s) {
        h ^= c;
        h *= 0x100000001b3ull;
      }
    }
  }
  return h;
}

std::map<std::string, std::string> make(const TestModelOptions& options) {
  ScratchDir dir;
  const Status status = write_test_model(dir.path(), options);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return read_all_files(dir.path());
}

std::map<std::string, std::string> make(TestModelPreset preset, uint64_t seed, bool fp8) {
  TestModelOptions options;
  options.preset = preset;
  options.seed = seed;
  options.fp8 = fp8;
  return make(options);
}

TEST(TestModelTest, WritesTheHuggingFaceFiles) {
  const auto files = make(TestModelPreset::kTiny, 0, false);
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "model.safetensors.index.json"}) {
    EXPECT_TRUE(files.contains(name)) << name;
  }
  int shards = 0;
  for (const auto& [name, bytes] : files) shards += name.ends_with(".safetensors");
  EXPECT_GE(shards, 3);
  const auto index = nlohmann::json::parse(files.at("model.safetensors.index.json"));
  uint64_t shard_bytes = 0;
  for (const auto& [name, bytes] : files) {
    if (name.ends_with(".safetensors")) {
      uint64_t header = 0;
      std::memcpy(&header, bytes.data(), 8);
      shard_bytes += bytes.size() - 8 - header;
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), shard_bytes);
}

TEST(TestModelTest, TinyConfigMatchesTheBrief) {
  const ModelConfig c = test_model_config(TestModelPreset::kTiny, false);
  Result<ModelConfig> parsed = parse_model_config(model_config_to_json(c), "tiny");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->first_k_dense_replace, 1);
  EXPECT_EQ(parsed->n_routed_experts, 8);
  EXPECT_EQ(parsed->n_group, 4);
  EXPECT_EQ(parsed->topk_group, 2);
  EXPECT_EQ(parsed->num_experts_per_tok, 2);
  EXPECT_TRUE(parsed->q_lora_rank.has_value());
  EXPECT_TRUE(parsed->rope_scaling.has_value());
  EXPECT_EQ(parsed->num_nextn_predict_layers, 1);
  EXPECT_GE(parsed->vocab_size, test_tokenizer_vocab_size());
  const int64_t params = model_parameter_count(c);
  EXPECT_GT(params, 100'000);
  EXPECT_LT(params, 1'000'000);
  const int64_t mini = model_parameter_count(test_model_config(TestModelPreset::kMini, false));
  EXPECT_GT(mini, 300'000'000);
  EXPECT_LT(mini, 1'000'000'000);
}

TEST(TestModelTest, SameSeedSameBytesOtherSeedOtherWeights) {
  const auto a = make(TestModelPreset::kTiny, 5, false);
  const auto b = make(TestModelPreset::kTiny, 5, false);
  const auto c = make(TestModelPreset::kTiny, 6, false);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.at("config.json"), c.at("config.json"));
  EXPECT_NE(a.at("model-00001-of-00004.safetensors"), c.at("model-00001-of-00004.safetensors"));
  const auto f1 = make(TestModelPreset::kTiny, 5, true);
  const auto f2 = make(TestModelPreset::kTiny, 5, true);
  EXPECT_EQ(f1, f2);
}

// The bytes of the tiny model are fixed for all machines and compilers (own RNG, own
// Box-Muller, IEEE basic operations only). If this changes, the generator changed: every
// stored fixture made from test models is then stale.
TEST(TestModelTest, GoldenHashOfTinySeed0) {
  EXPECT_EQ(fnv1a64(make(TestModelPreset::kTiny, 0, false)), 0xb9529e1876ff335cull);
  EXPECT_EQ(fnv1a64(make(TestModelPreset::kTiny, 0, true)), 0x3202ff100c37cd2full);
}

TEST(TestModelTest, Fp8WritesScalesWithPartialEdgeBlocks) {
  const auto files = make(TestModelPreset::kTiny, 1, true);
  const auto config = nlohmann::json::parse(files.at("config.json"));
  EXPECT_EQ(config["quantization_config"]["weight_block_size"], nlohmann::json({32, 32}));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "fp8");
  const auto index = nlohmann::json::parse(files.at("model.safetensors.index.json"));
  const auto& map = index["weight_map"];
  EXPECT_TRUE(map.contains("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"));
  EXPECT_TRUE(map.contains("model.layers.3.eh_proj.weight_scale_inv"));
  EXPECT_FALSE(map.contains("model.embed_tokens.weight_scale_inv"));
  EXPECT_FALSE(map.contains("model.layers.1.mlp.gate.weight_scale_inv"));
  // kv_a rows = 32 + 8 = 40 and dense intermediate 80 are not multiples of 32.
  const ModelConfig c = test_model_config(TestModelPreset::kTiny, true);
  EXPECT_NE((c.kv_lora_rank + c.qk_rope_head_dim) % 32, 0);
  EXPECT_NE(c.intermediate_size % 32, 0);
}

// The preset against deepseek-ai/DeepSeek-V2-Lite's config.json (transcribed here; only
// bos/eos differ: ours are the test tokenizer's).
TEST(TestModelTest, V2LiteConfigIsDeepSeekV2Lites) {
  EXPECT_EQ(*parse_test_model_preset("v2-lite"), TestModelPreset::kV2Lite);
  EXPECT_EQ(test_model_preset_name(TestModelPreset::kV2Lite), "v2-lite");
  const ModelConfig c = test_model_config(TestModelPreset::kV2Lite, false);
  const auto hf = nlohmann::json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
    "v_head_dim": 128, "vocab_size": 102400})");
  const auto ours = nlohmann::json::parse(model_config_to_json(c));
  for (const auto& [key, value] : hf.items()) {
    ASSERT_TRUE(ours.contains(key)) << key;
    EXPECT_EQ(ours[key], value) << key;
  }
  EXPECT_FALSE(ours.contains("quantization_config"));
  EXPECT_EQ(ours.value("num_nextn_predict_layers", 0), 0);
  EXPECT_EQ(ours["bos_token_id"], 0);
  EXPECT_EQ(ours["eos_token_id"], 1);

  Result<ModelConfig> parsed = parse_model_config(model_config_to_json(c), "v2-lite");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->arch, ModelArch::kDeepseekV2);
  EXPECT_EQ(parsed->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(parsed->scoring_func, ScoringFunc::kSoftmax);
  EXPECT_FALSE(parsed->q_lora_rank.has_value());
  EXPECT_EQ(parsed->num_nextn_predict_layers, 0);
  EXPECT_EQ(parsed->routed_scaling_factor, 1.0);
  EXPECT_FALSE(parsed->norm_topk_prob);
  ASSERT_TRUE(parsed->rope_scaling.has_value());
  EXPECT_EQ(parsed->rope_scaling->mscale_all_dim, 0.707);
  EXPECT_EQ(model_config_to_json(*parsed), model_config_to_json(c));

  const ModelConfig f = test_model_config(TestModelPreset::kV2Lite, true);
  EXPECT_EQ(f.fp8_block_rows, 128);
  EXPECT_EQ(f.fp8_block_cols, 128);
  EXPECT_EQ(
      nlohmann::json::parse(model_config_to_json(f))["quantization_config"]["weight_block_size"],
      nlohmann::json({128, 128}));
}

// Parameters that a token uses: all but the routed experts it is not sent to.
int64_t active_parameters(const ModelConfig& c) {
  int64_t inactive = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (c.is_moe_layer(layer)) {
      inactive += (c.n_routed_experts - c.num_experts_per_tok) * 3 * c.moe_intermediate_size *
                  c.hidden_size;
    }
  }
  return model_parameter_count(c) - inactive;
}

TEST(TestModelTest, V2LiteParameterCounts) {
  TestModelOptions options;
  options.preset = TestModelPreset::kV2Lite;
  Result<ModelConfig> full = test_model_config(options);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->num_hidden_layers, 27);
  int64_t from_layout = 0;
  for (const TensorSpec& spec : deepseek_tensor_layout(*full)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    from_layout += n;
  }
  EXPECT_EQ(from_layout, model_parameter_count(*full));
  // 15.7 B in all (15,706,484,224); 2.4 B active as DeepSeek counts it (without the input
  // embedding, a lookup: 2.45 B; 2.66 B with it).
  EXPECT_NEAR(static_cast<double>(from_layout), 15.7e9, 0.01 * 15.7e9);
  const int64_t active = active_parameters(*full) - full->vocab_size * full->hidden_size;
  EXPECT_GE(active, 2'400'000'000);
  EXPECT_LT(active, 2'500'000'000);

  options.num_layers = 4;  // the quick-bench model: 2.25 B
  Result<ModelConfig> four = test_model_config(options);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->num_hidden_layers, 4);
  EXPECT_NEAR(static_cast<double>(model_parameter_count(*four)), 2.25e9, 0.01 * 2.25e9);
}

TEST(TestModelTest, NumLayersOverridesThePreset) {
  for (int layers : {1, 5}) {
    for (bool fp8 : {false, true}) {
      ScratchDir dir;
      TestModelOptions options;
      options.num_layers = layers;
      options.fp8 = fp8;
      ASSERT_TRUE(write_test_model(dir.path(), options).ok());
      Result<Checkpoint> checkpoint = Checkpoint::open(dir.path());
      ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
      EXPECT_EQ(checkpoint->config().num_hidden_layers, layers);
      EXPECT_EQ(checkpoint->config().num_nextn_predict_layers, 1);
      ASSERT_TRUE(checkpoint->validate_layout().ok());
      for (const TensorSpec& spec : deepseek_tensor_layout(checkpoint->config())) {
        ASSERT_TRUE(checkpoint->get_bf16(spec.name, spec.shape).ok()) << spec.name;
      }
      EXPECT_TRUE(checkpoint->check_all_used().ok());
      // The MTP layer follows the last decoder layer.
      const auto index =
          nlohmann::json::parse(testing::read_file_bytes(dir.file("model.safetensors.index.json")));
      EXPECT_TRUE(index["weight_map"].contains("model.layers." + std::to_string(layers) +
                                               ".eh_proj.weight"));
    }
  }
  // The layers the preset has anyway: the same bytes as without the option.
  TestModelOptions three;
  three.num_layers = 3;
  EXPECT_EQ(make(three), make(TestModelPreset::kTiny, 0, false));
  for (int bad : {0, -1}) {
    ScratchDir dir;
    TestModelOptions options;
    options.num_layers = bad;
    const Status status = write_test_model(dir.path(), options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find("num_layers must be at least 1"), std::string::npos)
        << status.message();
    EXPECT_FALSE(test_model_config(options).ok());
  }
}

// The writer generates parts of tensors on several threads; neither the thread count nor
// the part size (odd sizes start parts in the middle of a Box-Muller pair) changes a byte.
TEST(TestModelTest, BytesDoNotDependOnThreadsOrParts) {
  for (TestModelPreset preset : {TestModelPreset::kTiny, TestModelPreset::kTinyV2}) {
    for (bool fp8 : {false, true}) {
      TestModelOptions options;
      options.preset = preset;
      options.fp8 = fp8;
      options.seed = 11;
      options.num_threads = 1;
      options.part_values = int64_t{1} << 40;  // one part per tensor, one thread
      const auto reference = make(options);
      for (int threads : {2, 5}) {
        for (int64_t part : {0, 1, 7, 1001}) {
          options.num_threads = threads;
          options.part_values = part;
          EXPECT_EQ(make(options), reference) << test_model_preset_name(preset) << " fp8 " << fp8
                                              << " threads " << threads << " part " << part;
        }
      }
    }
  }
}

uint64_t fnv1a64_of(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Every stored tensor is its own stream (seed XOR fnv1a64(name)) drawn one value at a time
// with next_normal (docs/test_models.md): N(0, 0.02), norms 1 + N(0, 0.02), the V3 router
// bias N(0, 0.05) as F32, the rest BF16; FP8 matrices are those values block-quantized.
TEST(TestModelTest, WeightsAreEachTensorsSequentialStream) {
  for (bool fp8 : {false, true}) {
    ScratchDir dir;
    TestModelOptions options;
    options.seed = 9;
    options.fp8 = fp8;
    options.part_values = 333;
    ASSERT_TRUE(write_test_model(dir.path(), options).ok());
    Result<Checkpoint> checkpoint = Checkpoint::open(dir.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
    const ModelConfig& config = checkpoint->config();
    for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      double mean = 0.0, std = 0.02;
      if (spec.role == TensorRole::kNorm) mean = 1.0;
      if (spec.role == TensorRole::kRouterBias) std = 0.05;
      DeterministicNormal rng(options.seed ^ fnv1a64_of(spec.name));
      std::vector<float> expected(static_cast<size_t>(n));
      for (float& v : expected) v = static_cast<float>(mean + std * rng.next_normal());

      Result<WeightTensor> raw = checkpoint->get_raw(spec.name);
      ASSERT_TRUE(raw.ok()) << spec.name;
      ASSERT_EQ(raw->numel(), n) << spec.name;
      std::string want;
      if (fp8 && is_fp8_quantizable(spec.role)) {
        ASSERT_EQ(raw->dtype, DType::kF8E4M3) << spec.name;
        const Fp8BlockQuantized q = quantize_fp8_blocks(
            {spec.shape[0], spec.shape[1], *config.fp8_block_rows, *config.fp8_block_cols},
            expected);
        want.assign(reinterpret_cast<const char*>(q.weight.data()), q.weight.size());
        Result<WeightTensor> scales = checkpoint->get_raw(fp8_scale_inv_name(spec.name));
        ASSERT_TRUE(scales.ok()) << spec.name;
        ASSERT_EQ(scales->nbytes(), q.scale_inv.size() * 4);
        EXPECT_EQ(std::memcmp(scales->data, q.scale_inv.data(), scales->nbytes()), 0) << spec.name;
      } else if (spec.role == TensorRole::kRouterBias) {
        ASSERT_EQ(raw->dtype, DType::kF32) << spec.name;
        want.assign(reinterpret_cast<const char*>(expected.data()), expected.size() * 4);
      } else {
        ASSERT_EQ(raw->dtype, DType::kBF16) << spec.name;
        std::vector<bf16> narrow(expected.size());
        for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = float_to_bf16(expected[i]);
        want.assign(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 2);
      }
      ASSERT_EQ(raw->nbytes(), want.size()) << spec.name;
      EXPECT_EQ(std::memcmp(raw->data, want.data(), want.size()), 0) << spec.name;
    }
  }
}

TEST(TestModelTest, TokenizerHasDeepseekStructure) {
  const auto tok = nlohmann::json::parse(test_tokenizer_json());
  EXPECT_EQ(tok["model"]["type"], "BPE");
  const auto& vocab = tok["model"]["vocab"];
  EXPECT_EQ(vocab["<｜begin▁of▁sentence｜>"], 0);
  EXPECT_EQ(vocab["<｜end▁of▁sentence｜>"], 1);
  EXPECT_EQ(vocab["!"], 3);
  EXPECT_EQ(vocab["Ġt"], 259);  // first merge, as in DeepSeek-V3
  int64_t max_id = 0;
  for (const auto& [token, id] : vocab.items()) max_id = std::max(max_id, id.get<int64_t>());
  std::set<std::string> added;
  for (const auto& t : tok["added_tokens"]) {
    added.insert(t["content"].get<std::string>());
    max_id = std::max(max_id, t["id"].get<int64_t>());
  }
  EXPECT_EQ(max_id + 1, test_tokenizer_vocab_size());
  for (const char* special : {"<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>",
                              "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"}) {
    EXPECT_TRUE(added.contains(special)) << special;
  }
  EXPECT_EQ(tok["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(tok["decoder"]["type"], "ByteLevel");
  const auto cfg = nlohmann::json::parse(test_tokenizer_config_json());
  EXPECT_EQ(cfg["add_bos_token"], true);
  EXPECT_EQ(cfg["bos_token"]["content"], "<｜begin▁of▁sentence｜>");
  EXPECT_NE(cfg["chat_template"].get<std::string>().find("<｜Assistant｜>"), std::string::npos);
}

}  // namespace
}  // namespace peerserve
