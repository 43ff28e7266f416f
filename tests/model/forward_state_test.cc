// The staged, reentrant forward: stage by stage equals forward(), two microbatches
// interleaved stage by stage equal each run alone, an empty step still runs every MoE
// exchange for a collective backend, and a failing stage abandons the step cleanly.
#include "model/forward_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/deepseek_model.h"
#include "model/expert_backend.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/observing_expert_backend.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::load_model;
using testing::make_cache;
using testing::ObservingBackend;
using testing::test_tokens;
using testing::tiny_checkpoint_dir;

ModelOptions bf16_options() {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kBf16;
  return o;
}

std::vector<int32_t> blocks_from(int32_t first, int32_t n) {
  std::vector<int32_t> b(n);
  for (int32_t i = 0; i < n; ++i) b[i] = first + i;
  return b;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The stages a step of the main model must go through, from the config alone.
std::vector<std::string> expected_stages(const ModelConfig& c) {
  std::vector<std::string> names;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    names.push_back("attention");
    if (layer < c.first_k_dense_replace) {
      names.push_back("dense_mlp");
    } else {
      for (const char* s : {"route", "dispatch", "shared_expert", "experts", "combine"}) {
        names.push_back(s);
      }
    }
  }
  names.push_back("head");
  return names;
}

TEST(ForwardStateTest, StageByStageEqualsForwardBitwise) {
  auto model = load_model(tiny_checkpoint_dir(), bf16_options());
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> tokens = test_tokens(11, vocab, 3);
  const std::vector<int32_t> blocks = blocks_from(0, 2);
  SequenceChunk chunk;
  chunk.tokens = tokens;
  chunk.block_table = blocks;
  chunk.all_logits = true;

  LatentKvCache cache_a = make_cache(*model, 8, DType::kBF16, 2);
  ForwardOutput whole;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache_a, &whole).ok());

  LatentKvCache cache_b = make_cache(*model, 8, DType::kBF16, 2);
  auto state = model->new_forward_state();
  EXPECT_EQ(state->stage(), ForwardStage::kIdle);
  ASSERT_TRUE(model->begin_forward(*state, {&chunk, 1}, cache_b).ok());
  std::vector<std::string> stages;
  while (state->stage() != ForwardStage::kDone) {
    stages.push_back(forward_stage_name(state->stage()));
    ASSERT_TRUE(model->run_stage(*state).ok());
  }
  EXPECT_EQ(stages, expected_stages(model->config()));
  ForwardOutput staged;
  model->take_output(*state, &staged);
  EXPECT_EQ(state->stage(), ForwardStage::kIdle);
  EXPECT_TRUE(bitwise_equal(whole.logits, staged.logits));
  EXPECT_TRUE(bitwise_equal(whole.hidden, staged.hidden));
  EXPECT_EQ(0, std::memcmp(cache_a.block_bytes(0).data(), cache_b.block_bytes(0).data(),
                           cache_a.block_bytes(0).size()));
}

// Two microbatches, each with its own state, advanced alternately one stage at a time
// (prefill, then a decode step), give bitwise what each gives run alone.
TEST(ForwardStateTest, TwoInterleavedMicrobatchesEqualSeparateRuns) {
  auto model = load_model(tiny_checkpoint_dir(), bf16_options());
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> tokens_a = test_tokens(13, vocab, 5);
  const std::vector<int32_t> tokens_b = test_tokens(6, vocab, 9);
  const std::vector<int32_t> blocks_a = blocks_from(0, 2), blocks_b = blocks_from(2, 1);

  auto run_alone = [&](const std::vector<int32_t>& tokens, const std::vector<int32_t>& blocks,
                       int64_t prompt) {
    LatentKvCache cache = make_cache(*model, 8, DType::kBF16, 3);
    auto state = model->new_forward_state();
    std::vector<float> logits;
    for (int64_t start : {int64_t{0}, prompt}) {
      SequenceChunk c;
      c.tokens = std::span<const int32_t>(tokens).subspan(start, start == 0 ? prompt : 1);
      c.start_pos = start;
      c.block_table = blocks;
      ForwardOutput out;
      EXPECT_TRUE(model->forward({&c, 1}, cache, *state, &out).ok());
      logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    }
    return logits;
  };
  const std::vector<float> alone_a = run_alone(tokens_a, blocks_a, 12);
  const std::vector<float> alone_b = run_alone(tokens_b, blocks_b, 5);

  LatentKvCache cache = make_cache(*model, 8, DType::kBF16, 3);
  auto state_a = model->new_forward_state(0), state_b = model->new_forward_state(1);
  std::vector<float> inter_a, inter_b;
  for (int step = 0; step < 2; ++step) {
    SequenceChunk a, b;
    a.tokens = std::span<const int32_t>(tokens_a).subspan(step == 0 ? 0 : 12, step == 0 ? 12 : 1);
    a.start_pos = step == 0 ? 0 : 12;
    a.block_table = blocks_a;
    b.tokens = std::span<const int32_t>(tokens_b).subspan(step == 0 ? 0 : 5, step == 0 ? 5 : 1);
    b.start_pos = step == 0 ? 0 : 5;
    b.block_table = blocks_b;
    ASSERT_TRUE(model->begin_forward(*state_a, {&a, 1}, cache).ok());
    ASSERT_TRUE(model->begin_forward(*state_b, {&b, 1}, cache).ok());
    while (state_a->stage() != ForwardStage::kDone || state_b->stage() != ForwardStage::kDone) {
      for (ForwardState* state : {state_a.get(), state_b.get()}) {
        if (state->stage() != ForwardStage::kDone) {
          ASSERT_TRUE(model->run_stage(*state).ok());
        }
      }
    }
    ForwardOutput out_a, out_b;
    model->take_output(*state_a, &out_a);
    model->take_output(*state_b, &out_b);
    inter_a.insert(inter_a.end(), out_a.logits.begin(), out_a.logits.end());
    inter_b.insert(inter_b.end(), out_b.logits.begin(), out_b.logits.end());
  }
  EXPECT_TRUE(bitwise_equal(alone_a, inter_a));
  EXPECT_TRUE(bitwise_equal(alone_b, inter_b));
}

TEST(ForwardStateTest, EmptyStepRunsEveryMoeExchangeOnlyForACollectiveBackend) {
  auto model = load_model(tiny_checkpoint_dir(), bf16_options());
  auto observer = std::make_shared<ObservingBackend>(model->expert_backend());
  model->set_expert_backend(observer);
  LatentKvCache cache = make_cache(*model, 8, DType::kBF16, 1);
  auto state = model->new_forward_state(1);
  ForwardOutput out;

  ASSERT_TRUE(model->forward({}, cache, *state, &out).ok());
  EXPECT_TRUE(observer->layers.empty());
  EXPECT_EQ(out.num_rows(), 0);

  observer->is_collective = true;
  ASSERT_TRUE(model->forward({}, cache, *state, &out).ok());
  std::vector<int64_t> moe_layers;
  const ModelConfig& c = model->config();
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) moe_layers.push_back(l);
  EXPECT_EQ(observer->layers, moe_layers);
  EXPECT_EQ(observer->tokens_seen, std::vector<int64_t>(moe_layers.size(), 0));
  EXPECT_EQ(out.num_rows(), 0);
  EXPECT_EQ(out.row_offsets, std::vector<int64_t>{0});
  // The call state was made once, for the state's microbatch slot.
  EXPECT_EQ(observer->slots, std::vector<int>{1});
}

TEST(ForwardStateTest, FailingStageAbandonsTheStepAndTheNextStepWorks) {
  auto model = load_model(tiny_checkpoint_dir(), bf16_options());
  const int64_t vocab = model->config().vocab_size;
  auto local = model->expert_backend();
  auto observer = std::make_shared<ObservingBackend>(local);
  model->set_expert_backend(observer);
  const std::vector<int32_t> tokens = test_tokens(4, vocab, 2);
  const std::vector<int32_t> blocks = blocks_from(0, 1);
  SequenceChunk chunk;
  chunk.tokens = tokens;
  chunk.block_table = blocks;
  LatentKvCache cache = make_cache(*model, 8, DType::kBF16, 1);
  auto state = model->new_forward_state();
  ForwardOutput out;

  observer->fail_compute = true;
  const Status failed = model->forward({&chunk, 1}, cache, *state, &out);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.to_string().find("rank 1 lost"), std::string::npos);
  EXPECT_EQ(state->stage(), ForwardStage::kIdle);

  observer->fail_compute = false;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, *state, &out).ok());
  ForwardOutput reference;
  model->set_expert_backend(local);
  LatentKvCache fresh = make_cache(*model, 8, DType::kBF16, 1);
  ASSERT_TRUE(model->forward({&chunk, 1}, fresh, &reference).ok());
  EXPECT_TRUE(bitwise_equal(out.logits, reference.logits));
}

TEST(ForwardStateTest, InvalidInputLeavesTheStateIdle) {
  auto model = load_model(tiny_checkpoint_dir(), bf16_options());
  const std::vector<int32_t> tokens{static_cast<int32_t>(model->config().vocab_size)};
  const std::vector<int32_t> blocks = blocks_from(0, 1);
  SequenceChunk chunk;
  chunk.tokens = tokens;
  chunk.block_table = blocks;
  LatentKvCache cache = make_cache(*model, 8, DType::kBF16, 1);
  auto state = model->new_forward_state();
  EXPECT_EQ(model->begin_forward(*state, {&chunk, 1}, cache).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state->stage(), ForwardStage::kIdle);
}

}  // namespace
}  // namespace peerserve
