// A DeepSeek-V2-style checkpoint (plain q_proj, softmax scores, group-limited greedy
// routing without correction bias or normalisation, routed_scaling_factor applied, YaRN
// mscale 0.707, no MTP) written here with random weights, against the float64 reference.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_model.h"
#include "model/deepseek_model.h"
#include "tensor/float_convert.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/reference_model.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

ModelConfig v2_config() {
  return test_model_config(TestModelPreset::kTinyV2, false);
}

std::string write_v2_checkpoint() {
  const ModelConfig c = v2_config();
  const std::string dir = testing::make_temp_dir("v2");
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0, state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&state]() {  // splitmix64 -> [-1, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) / 4503599627370496.0 - 1.0;
  };
  for (const TensorSpec& spec : deepseek_tensor_layout(c)) {
    EXPECT_NE(spec.role, TensorRole::kRouterBias);
    TensorToWrite t;
    t.name = spec.name;
    t.shape = spec.shape;
    t.dtype = DType::kBF16;
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<bf16> values(n);
    for (bf16& v : values) {
      // Uniform values with std ~0.03 (router: 0.5, so that routing is not uniform).
      const double scale = spec.role == TensorRole::kRouterGate ? 0.9 : 0.05;
      v = float_to_bf16(
          static_cast<float>((spec.role == TensorRole::kNorm ? 1.0 : 0.0) + scale * uniform()));
    }
    t.bytes.resize(n * 2);
    std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    total += t.bytes.size();
    weight_map[t.name] = "model.safetensors";
    tensors.push_back(std::move(t));
  }
  EXPECT_TRUE(write_safetensors_file(dir + "/model.safetensors", tensors).ok());
  EXPECT_TRUE(
      write_safetensors_index(dir + "/model.safetensors.index.json", total, weight_map).ok());
  std::ofstream(dir + "/config.json") << model_config_to_json(c);
  return dir;
}

TEST(V2VariantTest, PlainQProjSoftmaxGroupLimitedGreedyMatchesReference) {
  const std::string dir = write_v2_checkpoint();
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  ASSERT_EQ(checkpoint->config().arch, ModelArch::kDeepseekV2);
  ASSERT_FALSE(checkpoint->config().q_lora_rank.has_value());
  testing::ReferenceModel reference(*checkpoint);

  ModelOptions options;
  options.num_threads = 2;
  options.gemm_precision = GemmPrecision::kFp32;
  auto model = testing::load_model(dir, options);
  EXPECT_FALSE(model->has_mtp());
  const int64_t vocab = model->config().vocab_size;
  testing::TestSequence seq{testing::test_tokens(10, vocab, 21), {1, 0}, 0};
  const testing::Matrix ref = reference.forward(seq.tokens);
  LatentKvCache cache = testing::make_cache(*model, 8, DType::kF32, 2);

  ForwardOutput out;
  SequenceChunk chunk = seq.next_chunk(7, true);
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, &out).ok());
  seq.cached = 7;
  std::vector<float> got = out.logits;
  for (int i = 0; i < 3; ++i) {
    chunk = seq.next_chunk(1, false);
    ASSERT_TRUE(model->forward({&chunk, 1}, cache, &out).ok());
    seq.cached += 1;
    got.insert(got.end(), out.logits.begin(), out.logits.end());
  }
  double diff = 0, scale = 0;
  for (size_t r = 0; r < 10; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      diff = std::max(diff, std::abs(ref[r][j] - got[r * vocab + j]));
      scale = std::max(scale, std::abs(ref[r][j]));
    }
  }
  // fp32 path vs float64 reference: see reference_forward_test.cc for the 1e-5 bound.
  EXPECT_LT(diff / scale, 1e-5);
}

}  // namespace
}  // namespace peerserve
