// ExpertLoadRecorder counts every (token, expert) selection per layer, changes nothing in
// the results, and take() restarts the counts.
#include "model/expert_load_recorder.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "model/deepseek_model.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

TEST(ExpertLoadRecorderTest, CountsEverySelectionAndChangesNothing) {
  ModelOptions options;
  options.num_threads = 2;
  auto model = testing::load_model(testing::tiny_checkpoint_dir(), options);
  const ModelConfig& c = model->config();
  const std::vector<int32_t> tokens = testing::test_tokens(9, c.vocab_size, 5), blocks{0, 1};
  SequenceChunk chunk;
  chunk.tokens = tokens;
  chunk.block_table = blocks;
  LatentKvCache plain_cache = testing::make_cache(*model, 8, DType::kBF16, 2);
  ForwardOutput plain;
  ASSERT_TRUE(model->forward({&chunk, 1}, plain_cache, &plain).ok());

  auto recorder = std::make_shared<ExpertLoadRecorder>(model->expert_backend(),
                                                       c.num_hidden_layers + 1, c.n_routed_experts);
  model->set_expert_backend(recorder);
  LatentKvCache cache = testing::make_cache(*model, 8, DType::kBF16, 2);
  ForwardOutput counted;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, &counted).ok());
  ASSERT_EQ(plain.logits.size(), counted.logits.size());
  EXPECT_EQ(0, std::memcmp(plain.logits.data(), counted.logits.data(),
                           plain.logits.size() * sizeof(float)));

  const std::vector<int64_t> counts = recorder->counts();
  ASSERT_EQ(counts.size(), static_cast<size_t>((c.num_hidden_layers + 1) * c.n_routed_experts));
  for (int64_t layer = 0; layer <= c.num_hidden_layers; ++layer) {
    const auto first = counts.begin() + layer * c.n_routed_experts;
    const int64_t total = std::accumulate(first, first + c.n_routed_experts, int64_t{0});
    const bool moe = layer < c.num_hidden_layers && c.is_moe_layer(layer);
    // Each of the 9 tokens picks top_k distinct experts in every MoE layer but the last,
    // which runs only the token whose logits the step returns.
    const int64_t tokens = layer == c.num_hidden_layers - 1 ? 1 : 9;
    EXPECT_EQ(total, moe ? tokens * c.num_experts_per_tok : 0) << "layer " << layer;
  }
  EXPECT_EQ(recorder->take(), counts);
  const std::vector<int64_t> after = recorder->counts();
  EXPECT_EQ(std::accumulate(after.begin(), after.end(), int64_t{0}), 0);
}

}  // namespace
}  // namespace peerserve
