// An INT8 drafter (ModelOptions::quantize_draft): the MTP layer, its eh_proj and its head get
// INT8 forms while the main model keeps its BF16 weights, so the main model's logits are
// bitwise those of the unquantized model and only the drafts move (and stay close).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/weight_quantization.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::load_model;
using testing::make_cache;
using testing::max_rel_diff;
using testing::test_tokens;

TEST(Int8DrafterTest, QuantizesTheMtpLayerAndItsHeadOnly) {
  Result<Checkpoint> checkpoint = Checkpoint::open(testing::shipped_model_dir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  Result<DeepseekWeights> weights = load_deepseek_weights(*checkpoint, true, {});
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_TRUE(weights->mtp.has_value());
  ASSERT_EQ(weights->mtp->head.data, weights->lm_head.data) << "the loader shares equal heads";
  const bf16* lm_head = weights->lm_head.data;
  std::vector<const LinearWeight*> released;
  Result<bool> layer_changed = quantize_draft_int8(
      *weights, nullptr, [&](const LinearWeight& w) { released.push_back(&w); });
  ASSERT_TRUE(layer_changed.ok()) << layer_changed.status().to_string();
  EXPECT_TRUE(*layer_changed) << "the MTP layer's KV now comes from INT8 weights";
  MtpWeights& mtp = *weights->mtp;
  // The drafter: INT8 forms, BF16 forms dropped.
  for (const LinearWeight* w : {&mtp.eh_proj, &mtp.layer.attention.o_proj, &mtp.head}) {
    EXPECT_NE(w->int8, nullptr);
    EXPECT_EQ(w->data, nullptr);
  }
  ASSERT_TRUE(mtp.layer.moe.has_value());
  for (const MlpWeights& expert : mtp.layer.moe->experts) {
    EXPECT_NE(expert.gate_up_int8, nullptr);
    EXPECT_NE(expert.down.int8, nullptr);
  }
  // Its kv_b stays BF16, as under --quantize int8 (the absorbed attention reads its slices).
  EXPECT_EQ(mtp.layer.attention.kv_b.int8, nullptr);
  EXPECT_NE(mtp.layer.attention.kv_b.data, nullptr);
  // The main model is untouched, and the LM head keeps the BF16 values the MTP head shared:
  // their pages are not released either.
  EXPECT_EQ(weights->lm_head.data, lm_head);
  EXPECT_EQ(weights->lm_head.int8, nullptr);
  EXPECT_NE(mtp.head.int8.get(), weights->lm_head.int8.get());
  for (const DecoderLayerWeights& layer : weights->layers) {
    EXPECT_EQ(layer.attention.o_proj.int8, nullptr) << "layer " << layer.index;
    EXPECT_NE(layer.attention.o_proj.data, nullptr) << "layer " << layer.index;
  }
  EXPECT_NE(std::find(released.begin(), released.end(), &mtp.eh_proj), released.end());
  EXPECT_EQ(std::find(released.begin(), released.end(), &mtp.head), released.end())
      << "the shared head's BF16 pages are the LM head's";
}

// Under --quantize int8 the MTP layer is INT8 already: only a BF16 head gets a form, and the
// MTP layer's KV is what it was (the KV pool identity must not change).
TEST(Int8DrafterTest, AnInt8MtpLayerIsKept) {
  Result<Checkpoint> checkpoint = Checkpoint::open(testing::shipped_model_dir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  Result<DeepseekWeights> weights = load_deepseek_weights(*checkpoint, true, {});
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_TRUE(quantize_weights_int8(*weights, /*lm_head=*/false).ok());
  const auto eh_proj = weights->mtp->eh_proj.int8;
  ASSERT_NE(eh_proj, nullptr);
  ASSERT_EQ(weights->mtp->head.int8, nullptr);
  Result<bool> layer_changed = quantize_draft_int8(*weights);
  ASSERT_TRUE(layer_changed.ok()) << layer_changed.status().to_string();
  EXPECT_FALSE(*layer_changed);
  EXPECT_EQ(weights->mtp->eh_proj.int8, eh_proj) << "an INT8 form was made again";
  EXPECT_NE(weights->mtp->head.int8, nullptr);
  EXPECT_NE(weights->lm_head.data, nullptr);
}

TEST(Int8DrafterTest, MainLogitsStayBitwiseAndDraftsStayClose) {
  const std::string dir = testing::shipped_model_dir();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no " << dir;
  ModelOptions o;
  o.num_threads = 2;
  auto plain = load_model(dir, o);
  o.quantize_draft = WeightQuantization::kInt8;
  auto drafter = load_model(dir, o);
  EXPECT_FALSE(plain->mtp_runs_int8());
  EXPECT_TRUE(drafter->mtp_runs_int8());
  EXPECT_TRUE(drafter->draft_layer_requantized());
  const int64_t vocab = plain->config().vocab_size, hidden = plain->config().hidden_size;
  const std::vector<int32_t> tokens = test_tokens(40, vocab, 3);
  std::vector<int32_t> blocks = {0, 1, 2};
  LatentKvCache cache_p = make_cache(*plain, 16, DType::kBF16, 3);
  LatentKvCache cache_d = make_cache(*drafter, 16, DType::kBF16, 3);
  SequenceChunk chunk;
  chunk.tokens = std::span<const int32_t>(tokens).first(39);
  chunk.block_table = blocks;
  chunk.all_logits = true;
  ForwardOutput out_p, out_d;
  ASSERT_TRUE(plain->forward({&chunk, 1}, cache_p, &out_p).ok());
  ASSERT_TRUE(drafter->forward({&chunk, 1}, cache_d, &out_d).ok());
  ASSERT_EQ(out_p.logits.size(), out_d.logits.size());
  EXPECT_EQ(
      0, std::memcmp(out_p.logits.data(), out_d.logits.data(), out_p.logits.size() * sizeof(float)))
      << "the main model's logits moved: max rel diff " << max_rel_diff(out_p.logits, out_d.logits);

  // The MTP layer over every position, from the (equal) hidden states.
  const std::vector<float> states = out_p.hidden;
  ASSERT_EQ(static_cast<int64_t>(states.size()), 39 * hidden);
  MtpChunk mtp;
  mtp.next_tokens = std::span<const int32_t>(tokens).subspan(1, 39);
  mtp.hidden = states;
  mtp.block_table = blocks;
  mtp.all_logits = true;
  ASSERT_TRUE(plain->forward_mtp({&mtp, 1}, cache_p, &out_p).ok());
  ASSERT_TRUE(drafter->forward_mtp({&mtp, 1}, cache_d, &out_d).ok());
  ASSERT_EQ(out_p.logits.size(), out_d.logits.size());
  const double err = max_rel_diff(out_p.logits, out_d.logits);
  EXPECT_GT(err, 0.0) << "INT8 drafts equal BF16 bitwise: the INT8 kernels were not used";
  // Measured: 0.049 (max |diff| / max |logit|), every top token the same; the whole model in
  // INT8 moves the main logits by up to 0.089 here (int8_model_test).
  EXPECT_LT(err, 0.1);
  int64_t agree = 0;
  for (int64_t r = 0; r < 39; ++r) {
    const float* a = out_p.logits.data() + r * vocab;
    const float* b = out_d.logits.data() + r * vocab;
    agree += (std::max_element(a, a + vocab) - a) == (std::max_element(b, b + vocab) - b);
  }
  EXPECT_GE(agree, 35) << "of 39 drafts, the INT8 drafter's top token agreed with BF16's";
}

}  // namespace
}  // namespace peerserve
