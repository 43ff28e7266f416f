// DeepseekModel on the tiny preset: attention forms, paged incremental decode, ragged
// batches, FP8 checkpoints, the expert seam, MTP and input validation.
#include "model/deepseek_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cpu_features.h"
#include "kernels/matmul_packed_bf16.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/expert_backend.h"
#include "model/mla_attention.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::load_model;
using testing::make_cache;
using testing::max_rel_diff;
using testing::test_tokens;
using testing::TestSequence;
using testing::tiny_checkpoint_dir;

ModelOptions fp32_options(AttentionForm form = AttentionForm::kAuto) {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kFp32;
  o.attention_form = form;
  return o;
}

// Runs `seq` forward by `n` tokens; returns the logits rows.
std::vector<float> step(DeepseekModel& model, LatentKvCache& cache, TestSequence& seq, int64_t n,
                        bool all_logits) {
  const SequenceChunk chunk = seq.next_chunk(n, all_logits);
  ForwardOutput out;
  const Status s = model.forward({&chunk, 1}, cache, &out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  seq.cached += n;
  return out.logits;
}

std::vector<int32_t> iota_blocks(int64_t n, int32_t first = 0) {
  std::vector<int32_t> b(n);
  for (int64_t i = 0; i < n; ++i) b[i] = first + static_cast<int32_t>(i);
  return b;
}

TEST(DeepseekModelTest, AbsorbedAndPlainAttentionAgree) {
  auto plain = load_model(tiny_checkpoint_dir(), fp32_options(AttentionForm::kPlain));
  auto absorbed = load_model(tiny_checkpoint_dir(), fp32_options(AttentionForm::kAbsorbed));
  const int64_t vocab = plain->config().vocab_size;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    LatentKvCache cache_p = make_cache(*plain, 4, dtype, 32);
    LatentKvCache cache_a = make_cache(*absorbed, 4, dtype, 32);
    TestSequence seq_p{test_tokens(26, vocab, 1), iota_blocks(8), 0};
    TestSequence seq_a = seq_p;
    // A prefill of 19 tokens (every row), then a continuation chunk of 4 and 3 decode steps.
    for (int64_t n : {19, 4, 1, 1, 1}) {
      const std::vector<float> lp = step(*plain, cache_p, seq_p, n, true);
      const std::vector<float> la = step(*absorbed, cache_a, seq_a, n, true);
      ASSERT_EQ(lp.size(), static_cast<size_t>(n * vocab));
      // Same math in fp32 with different summation orders (kv_lora_rank-wide dot products
      // against 192-wide ones, W_UK folded into q): a few fp32 ulps per operation, far
      // below 1e-5 of the logit scale after 3 layers.
      EXPECT_LT(max_rel_diff(lp, la), 1e-5) << "chunk of " << n << ", dtype " << dtype_name(dtype);
    }
  }
}

// A 76-token sequence through both models over bf16 caches of many blocks (5 or 16 tokens
// each, the last one partly filled), prefilled in a chunk of 71 and then decoded: expects
// every step's logits within `bound` of each other (relative to the largest) and returns
// the largest difference seen. `label` names the configuration in failures.
double compare_forms_over_long_bf16_context(DeepseekModel& plain, DeepseekModel& absorbed,
                                            double bound, const std::string& label) {
  const int64_t vocab = plain.config().vocab_size;
  double worst = 0.0;
  for (int64_t block_size : {5, 16}) {
    const int64_t num_blocks = (80 + block_size - 1) / block_size;
    LatentKvCache cache_p = make_cache(plain, block_size, DType::kBF16, num_blocks);
    LatentKvCache cache_a = make_cache(absorbed, block_size, DType::kBF16, num_blocks);
    TestSequence seq_p{test_tokens(76, vocab, 3), iota_blocks(num_blocks), 0};
    TestSequence seq_a = seq_p;
    for (int64_t n : {71, 1, 1, 1, 2}) {
      const std::vector<float> lp = step(plain, cache_p, seq_p, n, true);
      const std::vector<float> la = step(absorbed, cache_a, seq_a, n, true);
      const double diff = max_rel_diff(lp, la);
      worst = std::max(worst, diff);
      EXPECT_LT(diff, bound) << label << ", block size " << block_size << ", chunk of " << n;
    }
  }
  return worst;
}

// The absorbed form over a long bf16 context against the plain form reading the same
// latents, fp32 activations: both read the same bf16 latents and differ only in fp32
// summation order (as above).
TEST(DeepseekModelTest, AbsorbedAttentionOverLongBf16ContextsAgreesWithPlain) {
  auto plain = load_model(tiny_checkpoint_dir(), fp32_options(AttentionForm::kPlain));
  auto absorbed = load_model(tiny_checkpoint_dir(), fp32_options(AttentionForm::kAbsorbed));
  compare_forms_over_long_bf16_context(*plain, *absorbed, 1e-5, "fp32 activations");
}

// The inference configuration (bf16 GEMM inputs, bf16 cache) scores the absorbed form's
// keys with the packed heads of a query (kernels/bf16_panels.h); against the plain form, which
// decompresses the keys instead and runs its scores and sums as packed bf16 products
// (kernels/bf16_panels.h), at every ISA level's packed kernel. Both round activations to
// bf16 at their own GEMM inputs, so they agree to bf16 precision (2^-8), not fp32: measured
// max relative logit difference 3.86e-3 at scalar, avx2 and avx512_bf16 alike (2.6e-3 while
// the plain form's scores and sums were fp32). The bound of 5e-3 caught the breaks tried:
// in the absorbed form, the last key's score left out (5.2e-2), one cache block's scores
// zeroed (7.2e-3); in the plain form, the last visible key left out (2.8e-2 and more), the
// keys' rope part read two elements early (1.3e-2 and more), the values read one column off
// (0.34 and more).
TEST(DeepseekModelTest, PackedDecodeScoresOverBf16CacheAgreeWithPlainAttention) {
  for (kernels::IsaLevel level :
       {kernels::IsaLevel::kScalar, kernels::IsaLevel::kAvx2, kernels::best_isa_level()}) {
    if (!kernels::isa_level_supported(level)) continue;
    kernels::ScopedIsaLevel isa(level);
    ModelOptions options;  // bf16 GEMM inputs
    options.num_threads = 2;
    options.attention_form = AttentionForm::kPlain;
    auto plain = load_model(tiny_checkpoint_dir(), options);
    options.attention_form = AttentionForm::kAbsorbed;
    auto absorbed = load_model(tiny_checkpoint_dir(), options);
    const std::string name(kernels::isa_level_name(level));
    const double worst = compare_forms_over_long_bf16_context(*plain, *absorbed, 5e-3, name);
    std::printf("[ packed scores ] %s: max relative logit difference to plain %.2e\n", name.c_str(),
                worst);
  }
}

// The inference configuration in one attention form: a prompt prefilled in chunks gives
// every row the bits of one prefill (what chunked prefill and prefix-cache hits rely on). In
// the plain form the packed bf16 products run over query tiles whose key limits differ with
// the split (kernels/bf16_panels.h: a row's result depends only on its visible keys); in the
// absorbed form every query is scored alone. Each form at scalar, avx2 and the best level.
TEST(DeepseekModelTest, ChunkedPrefillInOneFormGivesTheBitsOfOnePrefill) {
  for (kernels::IsaLevel level :
       {kernels::IsaLevel::kScalar, kernels::IsaLevel::kAvx2, kernels::best_isa_level()}) {
    if (!kernels::isa_level_supported(level)) continue;
    kernels::ScopedIsaLevel isa(level);
    for (AttentionForm form : {AttentionForm::kPlain, AttentionForm::kAbsorbed}) {
      ModelOptions options;  // bf16 GEMM inputs
      options.num_threads = 2;
      options.attention_form = form;
      auto model = load_model(tiny_checkpoint_dir(), options);
      const int64_t vocab = model->config().vocab_size, length = 70;
      const std::vector<int32_t> tokens = test_tokens(length, vocab, 7);
      LatentKvCache whole_cache = make_cache(*model, 16, DType::kBF16, 5);
      TestSequence whole{tokens, iota_blocks(5), 0};
      const std::vector<float> reference = step(*model, whole_cache, whole, length, true);
      for (const std::vector<int64_t>& split :
           {std::vector<int64_t>{33, 37}, {1, 40, 29}, {35, 3, 32}, {69, 1}}) {
        LatentKvCache cache = make_cache(*model, 16, DType::kBF16, 5);
        TestSequence seq{tokens, iota_blocks(5), 0};
        std::vector<float> rows;
        for (int64_t n : split) {
          const std::vector<float> part = step(*model, cache, seq, n, true);
          rows.insert(rows.end(), part.begin(), part.end());
        }
        ASSERT_EQ(rows.size(), reference.size());
        EXPECT_EQ(0, std::memcmp(rows.data(), reference.data(), rows.size() * sizeof(float)))
            << kernels::isa_level_name(level)
            << (form == AttentionForm::kPlain ? " plain" : " absorbed") << ", split starting "
            << split[0] << ": max relative difference " << max_rel_diff(rows, reference);
      }
    }
  }
}

// Draft verification: a chunk of K + 1 tokens marked decode_form gives, bit for bit, the
// rows of K + 1 one-token decode steps, even where the automatic choice would take the
// other attention form for a chunk of that length (here: 9 tokens after a 1-token prompt).
TEST(DeepseekModelTest, AChunkInDecodeFormGivesTheBitsOfItsDecodeSteps) {
  ModelOptions options;  // bf16 GEMM inputs, automatic attention form
  options.num_threads = 2;
  auto model = load_model(tiny_checkpoint_dir(), options);
  const int64_t prompt = 1, k = 8;
  ASSERT_FALSE(choose_absorbed_form(model->config(), AttentionForm::kAuto, k + 1, prompt + k + 1))
      << "premise: a chunk of this length would take the plain form";
  ASSERT_TRUE(choose_absorbed_form(model->config(), AttentionForm::kAuto, 1, prompt + 1));
  const std::vector<int32_t> tokens = test_tokens(prompt + k + 1, model->config().vocab_size, 12);

  LatentKvCache decode_cache = make_cache(*model, 16, DType::kBF16, 2);
  TestSequence decoded{tokens, iota_blocks(2), 0};
  step(*model, decode_cache, decoded, prompt, false);
  std::vector<float> decode_rows;
  for (int64_t i = 0; i <= k; ++i) {
    const std::vector<float> row = step(*model, decode_cache, decoded, 1, false);
    decode_rows.insert(decode_rows.end(), row.begin(), row.end());
  }

  LatentKvCache verify_cache = make_cache(*model, 16, DType::kBF16, 2);
  TestSequence verified{tokens, iota_blocks(2), 0};
  step(*model, verify_cache, verified, prompt, false);
  SequenceChunk chunk = verified.next_chunk(k + 1, true);
  chunk.decode_form = true;
  ForwardOutput out;
  ASSERT_TRUE(model->forward({&chunk, 1}, verify_cache, &out).ok());
  ASSERT_EQ(out.logits.size(), decode_rows.size());
  EXPECT_EQ(0,
            std::memcmp(out.logits.data(), decode_rows.data(), decode_rows.size() * sizeof(float)))
      << "max relative difference " << max_rel_diff(out.logits, decode_rows);
}

TEST(DeepseekModelTest, IncrementalDecodeOnPagedCacheEqualsFullRecomputation) {
  auto model = load_model(tiny_checkpoint_dir(), fp32_options());
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> all = test_tokens(24, vocab, 2);
  for (int64_t block_size : {1, 3, 16}) {
    const int64_t num_blocks = 64;
    LatentKvCache cache = make_cache(*model, block_size, DType::kF32, num_blocks);
    // Scattered, non-contiguous block ids: 61, 58, 55, ...
    TestSequence seq;
    seq.tokens = all;
    for (int64_t b = 0; b < (24 + block_size - 1) / block_size; ++b) {
      seq.blocks.push_back(
          static_cast<int32_t>((num_blocks - 3 - 3 * b + 3 * num_blocks) % num_blocks));
    }
    // Prefill in two chunks (the second continues at start_pos 7), then decode one by one.
    std::vector<std::vector<float>> incremental;
    step(*model, cache, seq, 7, false);
    incremental.push_back(step(*model, cache, seq, 9, false));
    while (seq.cached < static_cast<int64_t>(all.size())) {
      incremental.push_back(step(*model, cache, seq, 1, false));
    }
    // Full recomputation of each prefix in a fresh cache.
    for (size_t k = 0; k < incremental.size(); ++k) {
      const int64_t len = 16 + static_cast<int64_t>(k);
      LatentKvCache fresh = make_cache(*model, 16, DType::kF32, 4);
      TestSequence full{std::vector<int32_t>(all.begin(), all.begin() + len), iota_blocks(2), 0};
      const std::vector<float> logits = step(*model, fresh, full, len, false);
      // Plain (full prefill) vs absorbed (decode) forms and different chunkings: fp32
      // rounding only (see AbsorbedAndPlainAttentionAgree).
      EXPECT_LT(max_rel_diff(logits, incremental[k]), 1e-5)
          << "block size " << block_size << ", length " << len;
    }
  }
}

TEST(DeepseekModelTest, RaggedBatchEqualsSequencesRunOneByOneBitwise) {
  ModelOptions options;  // the inference defaults: bf16 activations, auto attention form
  options.num_threads = 2;
  auto model = load_model(tiny_checkpoint_dir(), options);
  ModelOptions one_thread = options;
  one_thread.num_threads = 1;
  auto model_1t = load_model(tiny_checkpoint_dir(), one_thread);
  const int64_t vocab = model->config().vocab_size;

  // Three sequences with disjoint blocks in one cache (batched) and in private caches.
  auto blocks = [](int32_t first, int32_t count) {  // descending: scattered in the cache
    std::vector<int32_t> b(count);
    for (int32_t i = 0; i < count; ++i) b[i] = first + count - 1 - i;
    return b;
  };
  std::vector<TestSequence> batched = {
      {test_tokens(44, vocab, 3), blocks(0, 11), 0},
      {test_tokens(26, vocab, 4), blocks(11, 7), 0},
      {test_tokens(36, vocab, 5), blocks(18, 9), 0},
  };
  std::vector<TestSequence> alone = batched;
  LatentKvCache shared_cache = make_cache(*model, 4, DType::kBF16, 27);
  std::vector<LatentKvCache> own_caches;
  for (int i = 0; i < 3; ++i) own_caches.push_back(make_cache(*model, 4, DType::kBF16, 27));

  // Step plans: tokens per sequence per step (prefill, continued prefill, decode mixed). The
  // first step's 90 rows run the per-row loops on the pool (for_row_ranges), each sequence
  // alone on the calling thread.
  const std::vector<std::vector<int64_t>> plan = {{40, 20, 30}, {1, 3, 1}, {1, 2, 1}, {1, 0, 3}};
  for (size_t s = 0; s < plan.size(); ++s) {
    std::vector<SequenceChunk> chunks;
    std::vector<int> which;
    for (int i = 0; i < 3; ++i) {
      if (plan[s][i] == 0) continue;
      chunks.push_back(batched[i].next_chunk(plan[s][i], /*all_logits=*/i == 1));
      which.push_back(i);
    }
    ForwardOutput out;
    ASSERT_TRUE(model->forward(chunks, shared_cache, &out).ok());
    ASSERT_EQ(out.row_offsets.size(), chunks.size() + 1);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int i = which[c];
      batched[i].cached += plan[s][i];
      // The same sequence alone (alternating 1 and 2 threads) in its own cache.
      DeepseekModel& solo = (s + i) % 2 ? *model_1t : *model;
      const std::vector<float> expected =
          step(solo, own_caches[i], alone[i], plan[s][i], /*all_logits=*/i == 1);
      const std::span<const float> got(out.logits.data() + out.row_offsets[c] * vocab,
                                       (out.row_offsets[c + 1] - out.row_offsets[c]) * vocab);
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)))
          << "step " << s << ", sequence " << i << ": max rel diff " << max_rel_diff(expected, got);
    }
  }
}

// The last layer runs only the rows a step returns (ModelOptions::skip_unreturned_rows);
// the others only write their KV. Against a model that runs every row: the same logits,
// hidden states and cache bytes, bitwise, for prefill chunks in both attention forms,
// continued prefills, decode tokens, chunks asking for every row, and the MTP layer (a
// chunk of which may only write its KV).
TEST(DeepseekModelTest, SkippingUnreturnedRowsChangesNoReturnedBit) {
  struct Case {
    const char* name;
    ModelOptions options;
  };
  std::vector<Case> cases;
  ModelOptions inference;  // bf16 activations, packed weights where fast, auto form
  inference.num_threads = 2;
  cases.push_back({"inference defaults", inference});
  cases.push_back({"fp32", fp32_options()});
  cases.push_back({"fp32 plain form", fp32_options(AttentionForm::kPlain)});
  cases.push_back({"fp32 absorbed form", fp32_options(AttentionForm::kAbsorbed)});
  ModelOptions int8 = inference;
  int8.quantize = WeightQuantization::kInt8;
  cases.push_back({"int8", int8});
  ModelOptions one_thread = inference;
  one_thread.num_threads = 1;
  cases.push_back({"one thread", one_thread});

  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.name);
    ModelOptions all_rows_options = test_case.options;
    all_rows_options.skip_unreturned_rows = false;
    auto skipping = load_model(tiny_checkpoint_dir(), test_case.options);
    auto all_rows = load_model(tiny_checkpoint_dir(), all_rows_options);
    ASSERT_TRUE(skipping->has_mtp());
    const int64_t vocab = skipping->config().vocab_size;
    LatentKvCache cache_s = make_cache(*skipping, 4, DType::kBF16, 40);
    LatentKvCache cache_a = make_cache(*all_rows, 4, DType::kBF16, 40);
    std::vector<TestSequence> seqs = {
        {test_tokens(60, vocab, 11), iota_blocks(16, 0), 0},
        {test_tokens(40, vocab, 12), iota_blocks(12, 16), 0},
        {test_tokens(30, vocab, 13), iota_blocks(12, 28), 0},
    };
    // Tokens per sequence per step; sequence 1 asks for every row's logits, sequence 2
    // for every row's hidden state (as a speculative step does).
    const std::vector<std::vector<int64_t>> plan = {{37, 17, 9}, {1, 5, 3}, {13, 1, 1}, {1, 2, 6}};
    for (size_t step_index = 0; step_index < plan.size(); ++step_index) {
      std::vector<SequenceChunk> chunks;
      for (size_t i = 0; i < seqs.size(); ++i) {
        SequenceChunk chunk = seqs[i].next_chunk(plan[step_index][i], /*all_logits=*/i == 1);
        chunk.all_hidden = i == 2;
        chunks.push_back(chunk);
      }
      ForwardOutput out_s, out_a;
      ASSERT_TRUE(skipping->forward(chunks, cache_s, &out_s).ok());
      ASSERT_TRUE(all_rows->forward(chunks, cache_a, &out_a).ok());
      EXPECT_EQ(out_s.row_offsets, out_a.row_offsets);
      EXPECT_EQ(out_s.hidden_row_offsets, out_a.hidden_row_offsets);
      ASSERT_EQ(out_s.logits.size(), out_a.logits.size());
      EXPECT_EQ(0, std::memcmp(out_s.logits.data(), out_a.logits.data(),
                               out_s.logits.size() * sizeof(float)))
          << "step " << step_index << ": max rel diff " << max_rel_diff(out_a.logits, out_s.logits);
      ASSERT_EQ(out_s.hidden.size(), out_a.hidden.size());
      EXPECT_EQ(0, std::memcmp(out_s.hidden.data(), out_a.hidden.data(),
                               out_s.hidden.size() * sizeof(float)))
          << "step " << step_index;

      // The MTP layer over each chunk's positions (its hidden rows for sequence 2, fresh
      // rows of the main model's scale for the others): only the last row's logits return,
      // and none for sequence 0, which only writes its MTP KV (kv_only).
      std::vector<std::vector<float>> hidden(seqs.size());
      std::vector<MtpChunk> mtp(seqs.size());
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int64_t n = plan[step_index][i];
        const int64_t h = skipping->config().hidden_size;
        if (i == 2) {
          const std::span<const float> rows = out_s.sequence_hidden(2);
          hidden[i].assign(rows.begin(), rows.end());
        } else {
          for (int64_t r = 0; r < n * h; ++r) hidden[i].push_back(0.01f * ((r * 37 + i) % 101));
        }
        const int64_t next = seqs[i].cached + 1;
        const int64_t count =
            std::min<int64_t>(n, static_cast<int64_t>(seqs[i].tokens.size()) - next);
        mtp[i].next_tokens = std::span<const int32_t>(seqs[i].tokens).subspan(next, count);
        mtp[i].hidden = std::span<const float>(hidden[i]).first(count * h);
        mtp[i].start_pos = seqs[i].cached;
        mtp[i].block_table = seqs[i].blocks;
        mtp[i].kv_only = i == 0;
      }
      ASSERT_TRUE(skipping->forward_mtp(mtp, cache_s, &out_s).ok());
      ASSERT_TRUE(all_rows->forward_mtp(mtp, cache_a, &out_a).ok());
      EXPECT_EQ(out_s.row_offsets, (std::vector<int64_t>{0, 0, 1, 2}));
      EXPECT_EQ(out_a.row_offsets, out_s.row_offsets);
      EXPECT_EQ(out_s.hidden_row_offsets, out_s.row_offsets);
      ASSERT_EQ(out_s.logits.size(), out_a.logits.size());
      EXPECT_EQ(0, std::memcmp(out_s.logits.data(), out_a.logits.data(),
                               out_s.logits.size() * sizeof(float)))
          << "MTP, step " << step_index;
      ASSERT_EQ(out_s.hidden.size(), out_a.hidden.size());
      EXPECT_EQ(0, std::memcmp(out_s.hidden.data(), out_a.hidden.data(),
                               out_s.hidden.size() * sizeof(float)))
          << "MTP, step " << step_index;
      // Every chunk KV-only (a step in which nobody drafts): no row comes back, and the same
      // MTP KV is written again.
      for (MtpChunk& m : mtp) m.kv_only = true;
      ASSERT_TRUE(skipping->forward_mtp(mtp, cache_s, &out_s).ok());
      ASSERT_TRUE(all_rows->forward_mtp(mtp, cache_a, &out_a).ok());
      EXPECT_EQ(out_s.row_offsets, (std::vector<int64_t>{0, 0, 0, 0}));
      EXPECT_EQ(out_a.row_offsets, out_s.row_offsets);
      EXPECT_TRUE(out_s.logits.empty() && out_s.hidden.empty());
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i].cached += plan[step_index][i];
      // Every layer's KV, the MTP layer's included, for every block.
      for (int64_t b = 0; b < cache_s.num_blocks(); ++b) {
        const std::span<const std::byte> kv_s = cache_s.block_bytes(b),
                                         kv_a = cache_a.block_bytes(b);
        ASSERT_EQ(0, std::memcmp(kv_s.data(), kv_a.data(), kv_s.size()))
            << "step " << step_index << ", block " << b;
      }
    }
  }
}

TEST(DeepseekModelTest, PackedBf16WeightsGiveTheCheckpointLayoutsLogits) {
  // Where the CPU has the packed kernel (avx512_bf16) the inference defaults repack the BF16
  // weights at load; the products then sum each output in another order (k in sequence per
  // lane instead of 32-wide dot products), so logits differ by fp32 rounding, which bf16
  // activation rounding at each GEMM input can amplify to bf16 resolution (2^-8) in a few
  // elements. Elsewhere both models run the same kernels and must agree bitwise.
  ModelOptions packed_options;
  packed_options.num_threads = 2;
  ModelOptions checkpoint_options = packed_options;
  checkpoint_options.pack_bf16 = false;
  auto packed = load_model(tiny_checkpoint_dir(), packed_options);
  auto plain = load_model(tiny_checkpoint_dir(), checkpoint_options);
  const int64_t vocab = packed->config().vocab_size;
  LatentKvCache cache_p = make_cache(*packed, 4, DType::kBF16, 32);
  LatentKvCache cache_c = make_cache(*plain, 4, DType::kBF16, 32);
  TestSequence seq_p{test_tokens(26, vocab, 2), iota_blocks(8), 0};
  TestSequence seq_c = seq_p;
  std::printf("[ pack ] packed bf16 kernel %s at this level\n",
              kernels::packed_bf16_is_fast() ? "used" : "not used");
  for (int64_t n : {19, 4, 1, 1, 1}) {
    const std::vector<float> lp = step(*packed, cache_p, seq_p, n, true);
    const std::vector<float> lc = step(*plain, cache_c, seq_c, n, true);
    ASSERT_EQ(lp.size(), lc.size());
    if (kernels::packed_bf16_is_fast()) {
      EXPECT_LT(max_rel_diff(lc, lp), 1e-2) << "chunk of " << n;
    } else {
      EXPECT_EQ(lp, lc) << "chunk of " << n;
    }
  }
}

// Writes a BF16 checkpoint holding the dequantized values of an FP8 one.
std::string write_dequantized_copy(const std::string& fp8_dir) {
  auto ckpt = Checkpoint::open(fp8_dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const std::string out_dir = testing::make_temp_dir("dequantized");
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (const TensorSpec& spec : deepseek_tensor_layout(ckpt->config())) {
    TensorToWrite t;
    t.name = spec.name;
    t.shape = spec.shape;
    if (spec.role == TensorRole::kRouterBias) {
      auto values = ckpt->get_f32(spec.name, spec.shape);
      EXPECT_TRUE(values.ok());
      t.dtype = DType::kF32;
      t.bytes.resize(values->size() * 4);
      std::memcpy(t.bytes.data(), values->data(), t.bytes.size());
    } else {
      auto w = ckpt->get_bf16(spec.name, spec.shape);
      EXPECT_TRUE(w.ok()) << w.status().to_string();
      t.dtype = DType::kBF16;
      t.bytes.resize(w->nbytes());
      std::memcpy(t.bytes.data(), w->data, t.bytes.size());
    }
    total += t.bytes.size();
    weight_map[t.name] = "model.safetensors";
    tensors.push_back(std::move(t));
  }
  EXPECT_TRUE(write_safetensors_file(out_dir + "/model.safetensors", tensors).ok());
  EXPECT_TRUE(
      write_safetensors_index(out_dir + "/model.safetensors.index.json", total, weight_map).ok());
  std::ifstream in(fp8_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config.erase("quantization_config");
  std::ofstream(out_dir + "/config.json") << config.dump(2);
  return out_dir;
}

TEST(DeepseekModelTest, Fp8CheckpointEqualsBf16CheckpointOfItsDequantizedValues) {
  const std::string fp8_dir = tiny_checkpoint_dir(/*fp8=*/true);
  const std::string bf16_dir = write_dequantized_copy(fp8_dir);
  auto fp8_model = load_model(fp8_dir, fp32_options());
  auto bf16_model = load_model(bf16_dir, fp32_options());
  const int64_t vocab = fp8_model->config().vocab_size;
  LatentKvCache cache_a = make_cache(*fp8_model, 8, DType::kF32, 4);
  LatentKvCache cache_b = make_cache(*bf16_model, 8, DType::kF32, 4);
  TestSequence a{test_tokens(13, vocab, 6), iota_blocks(2), 0};
  TestSequence b = a;
  for (int64_t n : {11, 1, 1}) {
    const std::vector<float> la = step(*fp8_model, cache_a, a, n, true);
    const std::vector<float> lb = step(*bf16_model, cache_b, b, n, true);
    // Identical weights after dequantization, identical code path: bitwise equal.
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  }
}

// Records the layers it is asked about, and delegates nothing: all routed outputs are zero.
class RecordingBackend final : public ExpertBackend {
 public:
  std::unique_ptr<Call> new_call(int /*slot*/) override { return std::make_unique<Call>(); }
  Status dispatch(const RoutedTokens& tokens, Call& /*call*/) override {
    layers.push_back(tokens.layer);
    rows += tokens.num_tokens;
    EXPECT_EQ(tokens.expert_ids.size(), static_cast<size_t>(tokens.num_tokens * tokens.top_k));
    return ok_status();
  }
  Status compute(Call& /*call*/) override { return ok_status(); }
  Status combine(Call& /*call*/, std::span<float> out) override {
    std::fill(out.begin(), out.end(), 0.0f);
    return ok_status();
  }
  std::vector<int64_t> layers;
  int64_t rows = 0;
};

TEST(DeepseekModelTest, RoutedExpertsGoThroughTheExpertBackend) {
  auto model = load_model(tiny_checkpoint_dir(), fp32_options());
  const int64_t vocab = model->config().vocab_size;
  LatentKvCache cache = make_cache(*model, 8, DType::kF32, 4);
  TestSequence seq{test_tokens(5, vocab, 7), iota_blocks(1), 0};
  const std::vector<float> with_experts = step(*model, cache, seq, 5, false);

  auto backend = std::make_shared<RecordingBackend>();
  model->set_expert_backend(backend);
  LatentKvCache cache2 = make_cache(*model, 8, DType::kF32, 4);
  TestSequence seq2{seq.tokens, iota_blocks(1), 0};
  const std::vector<float> without = step(*model, cache2, seq2, 5, false);
  // Layers 1 and 2 are MoE (first_k_dense_replace = 1). Layer 1 sees the 5 tokens; layer 2,
  // the last, only the one whose logits the step returns (ModelOptions::skip_unreturned_rows).
  EXPECT_EQ(backend->layers, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(backend->rows, 5 + 1);
  EXPECT_GT(max_rel_diff(with_experts, without), 1e-3);
}

TEST(DeepseekModelTest, MtpLayerProducesDraftLogits) {
  auto model = load_model(tiny_checkpoint_dir(), fp32_options());
  ASSERT_TRUE(model->has_mtp());
  const ModelConfig& c = model->config();
  EXPECT_EQ(model->kv_layout(4, DType::kBF16).num_layers, c.num_hidden_layers + 1);
  LatentKvCache cache = make_cache(*model, 4, DType::kF32, 8);
  TestSequence seq{test_tokens(9, c.vocab_size, 8), iota_blocks(3), 0};
  const SequenceChunk chunk = seq.next_chunk(8, true);
  ForwardOutput main_out;
  ASSERT_TRUE(model->forward({&chunk, 1}, cache, &main_out).ok());
  ASSERT_EQ(main_out.hidden.size(), static_cast<size_t>(8 * c.hidden_size));

  // Draft for positions 0..7: hidden at p with the token at p + 1.
  MtpChunk mtp;
  mtp.next_tokens = std::span<const int32_t>(seq.tokens).subspan(1, 8);
  mtp.hidden = main_out.hidden;
  mtp.start_pos = 0;
  mtp.block_table = seq.blocks;
  mtp.all_logits = true;
  ForwardOutput draft;
  ASSERT_TRUE(model->forward_mtp({&mtp, 1}, cache, &draft).ok());
  EXPECT_EQ(draft.num_rows(), 8);
  EXPECT_EQ(draft.logits.size(), static_cast<size_t>(8 * c.vocab_size));
  for (float v : draft.logits) ASSERT_TRUE(std::isfinite(v));

  // Incremental MTP (its own KV slot) equals the full MTP pass.
  LatentKvCache cache2 = make_cache(*model, 4, DType::kF32, 8);
  ASSERT_TRUE(model->forward({&chunk, 1}, cache2, &main_out).ok());
  MtpChunk first = mtp;
  first.next_tokens = mtp.next_tokens.subspan(0, 5);
  first.hidden = std::span<const float>(main_out.hidden).subspan(0, 5 * c.hidden_size);
  ForwardOutput part;
  ASSERT_TRUE(model->forward_mtp({&first, 1}, cache2, &part).ok());
  MtpChunk rest = mtp;
  rest.start_pos = 5;
  rest.next_tokens = mtp.next_tokens.subspan(5, 3);
  rest.hidden = std::span<const float>(main_out.hidden).subspan(5 * c.hidden_size);
  ASSERT_TRUE(model->forward_mtp({&rest, 1}, cache2, &part).ok());
  EXPECT_LT(
      max_rel_diff(std::span<const float>(draft.logits).subspan(5 * c.vocab_size), part.logits),
      1e-5);
}

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_model(tiny_checkpoint_dir(), fp32_options());
    cache_ = std::make_unique<LatentKvCache>(make_cache(*model_, 4, DType::kBF16, 6));
    tokens_ = {3, 4, 5, 6, 7};
    blocks_ = {0, 1};
  }
  // Runs the chunks; expects the error code and message part, and an untouched cache.
  void expect_error(std::span<const SequenceChunk> chunks, StatusCode code,
                    const std::string& part) {
    std::vector<std::byte> before(cache_->total_bytes());
    std::memcpy(before.data(), cache_->block_bytes(0).data(), before.size());
    ForwardOutput out;
    const Status s = model_->forward(chunks, *cache_, &out);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(part), std::string::npos) << s.to_string();
    EXPECT_EQ(0, std::memcmp(before.data(), cache_->block_bytes(0).data(), before.size()));
  }
  SequenceChunk chunk() const {
    SequenceChunk c;
    c.tokens = tokens_;
    c.block_table = blocks_;
    return c;
  }
  std::unique_ptr<DeepseekModel> model_;
  std::unique_ptr<LatentKvCache> cache_;
  std::vector<int32_t> tokens_, blocks_;
};

TEST_F(ValidationTest, RejectsBadInputWithClearErrors) {
  // A valid second sequence in every batch shows that nothing is written before the check.
  const std::vector<int32_t> ok_blocks = {4, 5};
  SequenceChunk good = chunk();
  good.block_table = ok_blocks;

  SequenceChunk bad = chunk();
  bad.tokens = {};
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "sequence 1: no new tokens");

  std::vector<int32_t> bad_tokens = {3, 4, static_cast<int32_t>(model_->config().vocab_size)};
  bad = chunk();
  bad.tokens = bad_tokens;
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "outside the vocabulary");
  bad_tokens[2] = -1;
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "token id -1 at index 2");

  bad = chunk();
  bad.block_table = std::span<const int32_t>(blocks_).subspan(0, 1);
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "block table has 1 blocks");

  const std::vector<int32_t> out_of_cache = {0, 6};
  bad = chunk();
  bad.block_table = out_of_cache;
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "block id 6");

  bad = chunk();
  bad.start_pos = model_->config().max_position_embeddings - 2;
  expect_error(std::vector{good, bad}, StatusCode::kOutOfRange, "max_position_embeddings");

  bad = chunk();
  bad.start_pos = -3;
  expect_error(std::vector{good, bad}, StatusCode::kInvalidArgument, "start_pos = -3");

  // Two sequences writing the same block.
  expect_error(std::vector{chunk(), good, chunk()}, StatusCode::kInvalidArgument,
               "also written by sequence 0");

  // A cache without the layout the model needs.
  KvLayout layout = model_->kv_layout(4, DType::kBF16);
  layout.latent_dim += 1;
  auto wrong = LatentKvCache::create(layout, 4);
  ASSERT_TRUE(wrong.ok());
  ForwardOutput out;
  const SequenceChunk c = chunk();
  EXPECT_EQ(model_->forward({&c, 1}, *wrong, &out).code(), StatusCode::kInvalidArgument);

  // MTP: hidden of the wrong size.
  MtpChunk mtp;
  mtp.next_tokens = tokens_;
  mtp.block_table = blocks_;
  std::vector<float> hidden(3);
  mtp.hidden = hidden;
  const Status s = model_->forward_mtp({&mtp, 1}, *cache_, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hidden has 3 values"), std::string::npos) << s.to_string();
}

TEST_F(ValidationTest, EmptyStepIsANoOp) {
  ForwardOutput out;
  ASSERT_TRUE(model_->forward({}, *cache_, &out).ok());
  EXPECT_EQ(out.num_rows(), 0);
  EXPECT_EQ(out.row_offsets.size(), 1u);
  ASSERT_TRUE(model_->forward_mtp({}, *cache_, &out).ok());
  EXPECT_EQ(out.num_rows(), 0);
}

TEST(DeepseekModelTest, LoadFailsOnMissingCheckpoint) {
  auto model = DeepseekModel::load("/nonexistent/peerserve/model", ModelOptions{});
  EXPECT_FALSE(model.ok());
}

}  // namespace
}  // namespace peerserve
