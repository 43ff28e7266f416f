// The fast forward pass against the independent double-precision reference
// (reference_model.h) on the tiny preset: a prompt (every position), several decode steps
// on the paged cache, and the MTP layer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_model.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/reference_model.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::Matrix;

double max_rel_diff(const Matrix& ref, std::span<const float> got, size_t first_row, size_t rows) {
  const size_t vocab = ref[0].size();
  EXPECT_EQ(got.size(), rows * vocab);
  double diff = 0, scale = 0;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < vocab; ++j) {
      diff = std::max(diff, std::abs(ref[first_row + r][j] - got[r * vocab + j]));
      scale = std::max(scale, std::abs(ref[first_row + r][j]));
    }
  }
  return diff / scale;
}

struct Case {
  GemmPrecision precision;
  DType cache_dtype;
  double tolerance;
};

class ReferenceForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceForwardTest, PromptDecodeAndMtpMatchTheReference) {
  const Case& param = GetParam();
  auto checkpoint = Checkpoint::open(testing::tiny_checkpoint_dir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  testing::ReferenceModel reference(*checkpoint);

  ModelOptions options;
  options.num_threads = 2;
  options.gemm_precision = param.precision;
  auto model = testing::load_model(testing::tiny_checkpoint_dir(), options);
  const int64_t vocab = model->config().vocab_size, hidden = model->config().hidden_size;
  const int64_t prompt = 12, total = 17;
  testing::TestSequence seq{testing::test_tokens(total, vocab, 11), {3, 0, 2}, 0};
  LatentKvCache cache = testing::make_cache(*model, 8, param.cache_dtype, 4);

  Matrix ref_hidden;
  const Matrix ref = reference.forward(seq.tokens, &ref_hidden);

  // The prompt, every position.
  SequenceChunk chunk = seq.next_chunk(prompt, true);
  ForwardOutput out;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, &out).ok());
  seq.cached = prompt;
  EXPECT_LT(max_rel_diff(ref, out.logits, 0, prompt), param.tolerance) << "prompt";
  std::vector<float> hidden_rows = out.hidden;

  // Decode steps, one token each (the absorbed form over the paged cache).
  for (int64_t pos = prompt; pos < total; ++pos) {
    chunk = seq.next_chunk(1, false);
    ASSERT_TRUE(model->forward({&chunk, 1}, cache, &out).ok());
    seq.cached += 1;
    EXPECT_LT(max_rel_diff(ref, out.logits, pos, 1), param.tolerance) << "position " << pos;
    hidden_rows.insert(hidden_rows.end(), out.hidden.begin(), out.hidden.end());
  }

  // MTP over positions 0..total-2 (hidden at p, token at p + 1), against the reference MTP
  // fed with the reference's own hidden states.
  const std::vector<int32_t> next(seq.tokens.begin() + 1, seq.tokens.end());
  Matrix ref_hidden_used(ref_hidden.begin(), ref_hidden.end() - 1);
  const Matrix ref_mtp = reference.forward_mtp(next, ref_hidden_used);
  MtpChunk mtp;
  mtp.next_tokens = next;
  mtp.hidden = std::span<const float>(hidden_rows).subspan(0, (total - 1) * hidden);
  mtp.block_table = seq.blocks;
  mtp.all_logits = true;
  ASSERT_TRUE(model->forward_mtp({&mtp, 1}, cache, &out).ok());
  EXPECT_LT(max_rel_diff(ref_mtp, out.logits, 0, total - 1), param.tolerance) << "MTP";
}

// A config whose rms_norm_eps is far from 1e-6: it applies to the layer, final and MTP norms,
// while q_a_layernorm and kv_a_layernorm keep the RMSNorm default 1e-6, as in DeepSeek's and
// Hugging Face's modeling code (with 1e-2 there too, the logits move by ~1e-1 of their scale).
TEST(ReferenceForwardConfigTest, RmsNormEpsLeavesTheLowRankNormsAtTheirDefault) {
  const std::string dir = testing::make_temp_dir("eps");
  for (const auto& entry : std::filesystem::directory_iterator(testing::tiny_checkpoint_dir())) {
    const std::filesystem::path to = std::filesystem::path(dir) / entry.path().filename();
    if (entry.path().filename() == "config.json") {
      nlohmann::json config = nlohmann::json::parse(std::ifstream(entry.path()));
      config["rms_norm_eps"] = 1e-2;
      std::ofstream(to) << config.dump();
    } else {
      std::filesystem::create_symlink(entry.path(), to);
    }
  }
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  ASSERT_EQ(checkpoint->config().rms_norm_eps, 1e-2);
  testing::ReferenceModel reference(*checkpoint);
  ModelOptions options;
  options.num_threads = 2;
  options.gemm_precision = GemmPrecision::kFp32;
  auto model = testing::load_model(dir, options);
  const int64_t prompt = 12;
  testing::TestSequence seq{
      testing::test_tokens(prompt, model->config().vocab_size, 11), {3, 0, 2}, 0};
  LatentKvCache cache = testing::make_cache(*model, 8, DType::kF32, 4);
  const Matrix ref = reference.forward(seq.tokens, nullptr);
  SequenceChunk chunk = seq.next_chunk(prompt, true);
  ForwardOutput out;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, &out).ok());
  EXPECT_LT(max_rel_diff(ref, out.logits, 0, prompt), 1e-5);
}

// fp32 activations and an fp32 cache: only fp32 rounding (relative ~1e-7 per operation,
// accumulated over 3 layers, sums of up to 80 terms and softmax) separates the paths;
// 1e-4 of the logit scale leaves two orders of magnitude of margin for that while still
// catching any formula error (those move logits by >= 1e-2 of their scale).
// bf16 activations and cache: every GEMM input and cached latent is rounded to 8 bits of
// mantissa (relative 4e-3 each), so 3e-2 of the logit scale.
INSTANTIATE_TEST_SUITE_P(Precisions, ReferenceForwardTest,
                         ::testing::Values(Case{GemmPrecision::kFp32, DType::kF32, 1e-5},
                                           Case{GemmPrecision::kBf16, DType::kBF16, 2e-2}));

}  // namespace
}  // namespace peerserve
