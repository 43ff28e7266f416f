// Load-time W8A8 (ModelOptions::quantize = kInt8, docs/quantization.md): INT8 logits stay
// close to BF16 (measured tolerances) on the tiny preset and the shipped reference model; the
// quantized model keeps the engine's batch invariance (a ragged batch gives each sequence's
// logits bitwise, expert order and copies do not matter); and the INT8 forms are really used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
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
using testing::tiny_checkpoint_dir;

ModelOptions options(WeightQuantization q,
                     std::function<std::vector<int32_t>(int64_t)> select = {}) {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kBf16;
  o.quantize = q;
  o.routed_experts = std::move(select);
  o.load_mtp = false;
  return o;
}

// Logits of every position of each sequence, all prefilled in one ragged step.
std::vector<std::vector<float>> prefill(DeepseekModel& model,
                                        const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t block = 16;
  std::vector<std::vector<int32_t>> tables;
  int32_t next = 0;
  for (const auto& s : seqs) {
    std::vector<int32_t> t;
    for (int64_t p = 0; p < static_cast<int64_t>(s.size()); p += block) t.push_back(next++);
    tables.push_back(t);
  }
  LatentKvCache cache = make_cache(model, block, DType::kBF16, next);
  std::vector<SequenceChunk> chunks(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    chunks[i].tokens = seqs[i];
    chunks[i].block_table = tables[i];
    chunks[i].all_logits = true;
  }
  ForwardOutput out;
  PS_CHECK(model.forward(chunks, cache, &out).ok());
  std::vector<std::vector<float>> logits;
  int64_t row = 0;
  for (const auto& s : seqs) {
    const auto n = static_cast<int64_t>(s.size());
    logits.emplace_back(out.logits.begin() + row * out.vocab_size,
                        out.logits.begin() + (row + n) * out.vocab_size);
    row += n;
  }
  return logits;
}

double top1_agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  int64_t agree = 0, rows = static_cast<int64_t>(a.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    agree += (std::max_element(x, x + vocab) - x) == (std::max_element(y, y + vocab) - y);
  }
  return static_cast<double>(agree) / rows;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The model's logits change when it is quantized (else the INT8 path would not be in use),
// but stay within `tolerance` of BF16 (max |diff| / max |logit|), and agree on the top token.
void expect_close_to_bf16(const std::string& dir, double tolerance, double min_top1) {
  auto bf16 = load_model(dir, options(WeightQuantization::kNone));
  auto int8 = load_model(dir, options(WeightQuantization::kInt8));
  const int64_t vocab = bf16->config().vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {test_tokens(48, vocab, 1),
                                                  test_tokens(33, vocab, 2)};
  const auto ref = prefill(*bf16, seqs);
  const auto got = prefill(*int8, seqs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const double err = max_rel_diff(ref[i], got[i]);
    EXPECT_GT(err, 0.0) << "INT8 logits equal BF16 bitwise: the INT8 kernels were not used";
    EXPECT_LT(err, tolerance) << dir << " sequence " << i;
    EXPECT_GE(top1_agreement(ref[i], got[i], vocab), min_top1) << dir << " sequence " << i;
  }
}

// Tolerances from the errors measured on this code, with margin: max |diff| / max |logit|
// over every position of random-token sequences was 0.055 and 0.010 (tiny preset) and 0.089
// and 0.061 (shipped model), top-1 agreement 0.98 / 0.97 and 0.96 / 0.88 (random tokens make
// the model unsure, so near-tied logits flip; on real text the bench measures 97.7% and a
// perplexity within +0.1%, docs/quantization.md). Per-token INT8 activations and
// per-channel INT8 weights each carry up to half a step (1/254 of the row's range) of error
// per element, and it accumulates over the layers.
TEST(Int8ModelTest, TinyPresetLogitsStayCloseToBf16) {
  expect_close_to_bf16(tiny_checkpoint_dir(), 0.1, 0.9);
}

TEST(Int8ModelTest, ShippedModelLogitsStayCloseToBf16) {
  const std::string dir = testing::shipped_model_dir();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no " << dir;
  expect_close_to_bf16(dir, 0.15, 0.8);
}

// Quantizing at load leaves one form per weight, as an INT8 checkpoint has: the BF16 copy of
// a converted (FP8) weight is freed, and the MTP head that the loader shares with the LM head
// (the shipped model stores a copy) gets the LM head's INT8 form, not a second one.
TEST(Int8ModelTest, QuantizingAtLoadKeepsOneFormPerWeight) {
  {
    Result<Checkpoint> checkpoint = Checkpoint::open(tiny_checkpoint_dir(/*fp8=*/true));
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
    Result<DeepseekWeights> weights = load_deepseek_weights(*checkpoint, false, {});
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    LinearWeight& o_proj = weights->layers.front().attention.o_proj;
    ASSERT_NE(o_proj.data, nullptr);
    const std::weak_ptr<const void> bf16_copy = o_proj.storage;
    ASSERT_FALSE(bf16_copy.expired());
    ASSERT_TRUE(quantize_weights_int8(*weights, true).ok());
    EXPECT_NE(o_proj.int8, nullptr);
    EXPECT_EQ(o_proj.data, nullptr);
    EXPECT_TRUE(bf16_copy.expired()) << "the dequantized BF16 copy of an FP8 weight stayed";
  }
  const std::string dir = testing::shipped_model_dir();
  Result<Checkpoint> checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  Result<DeepseekWeights> weights = load_deepseek_weights(*checkpoint, true, {});
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_TRUE(weights->mtp.has_value());
  ASSERT_EQ(weights->mtp->head.data, weights->lm_head.data) << "the loader shares equal heads";
  ASSERT_TRUE(quantize_weights_int8(*weights, true).ok());
  ASSERT_NE(weights->lm_head.int8, nullptr);
  EXPECT_EQ(weights->mtp->head.int8.get(), weights->lm_head.int8.get());
}

TEST(Int8ModelTest, RaggedBatchGivesEachSequenceItsLogitsBitwise) {
  auto model = load_model(tiny_checkpoint_dir(), options(WeightQuantization::kInt8));
  const int64_t vocab = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {
      test_tokens(40, vocab, 5), test_tokens(7, vocab, 6), test_tokens(1, vocab, 7)};
  const auto together = prefill(*model, seqs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(together[i], prefill(*model, {seqs[i]})[0])) << "sequence " << i;
  }
}

TEST(Int8ModelTest, ExpertOrderAndCopiesDoNotChangeTheLogits) {
  auto whole = load_model(tiny_checkpoint_dir(), options(WeightQuantization::kInt8));
  const int32_t n = static_cast<int32_t>(whole->config().n_routed_experts);
  const auto tokens = test_tokens(24, whole->config().vocab_size, 9);
  const auto reference = prefill(*whole, {tokens})[0];
  auto shuffled =
      load_model(tiny_checkpoint_dir(), options(WeightQuantization::kInt8, [n](int64_t) {
                   std::vector<int32_t> ids;
                   for (int32_t e = 2 * n - 1; e >= 0; --e) ids.push_back(e % n);
                   return ids;
                 }));
  EXPECT_TRUE(bitwise_equal(reference, prefill(*shuffled, {tokens})[0]));
}

}  // namespace
}  // namespace peerserve
