#include "model/checkpoint/test_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_tokenizer.h"
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

std::map<std::string, std::string> make(TestModelPreset preset, uint64_t seed, bool fp8) {
  ScratchDir dir;
  TestModelOptions options;
  options.preset = preset;
  options.seed = seed;
  options.fp8 = fp8;
  EXPECT_TRUE(write_test_model(dir.path(), options).ok());
  return read_all_files(dir.path());
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
