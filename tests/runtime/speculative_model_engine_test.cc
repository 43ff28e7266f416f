// Speculative decoding (MTP) with the real model in the engine: the tokens are those of
// non-speculative decoding, token for token, for greedy requests, on the tiny preset (fp32,
// one attention form: exact) and on the shipped trained model (bf16, the serving defaults),
// in batches mixing chunked prefills and decodes, under preemption, with K = 1 and 2, and
// with an EOS, a stop token id and a stop string landing inside a run of accepted drafts.
// Seeded sampled requests give the tokens of non-speculative decoding too, under any load.
//
// Exactness argument: a verification chunk of 1 + k tokens gives each row the logits a
// one-token decode at that position gives (batch-invariant GEMMs, attention per query, and
// the same attention form for both chunk sizes at every context these tests reach), so the
// greedy verifier emits the greedy tokens whatever the drafts are.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>

#include "model/checkpoint/test_model.h"
#include "model/deepseek_model.h"
#include "runtime/engine.h"
#include "runtime/model_executor.h"
#include "tests/model/observing_expert_backend.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct RunConfig {
  int32_t num_speculative_tokens = 0;
  int microbatches = 1;
  int32_t max_num_batched_tokens = 24;
  int32_t num_blocks = 256;
  int32_t block_size = 4;
  DType kv_dtype = DType::kF32;
  std::optional<TokenId> eos;
  // Each request submitted after the one before it finished: every step holds one sequence,
  // so the schedule does not depend on when the engine thread takes the requests.
  bool one_at_a_time = false;
};

struct RunResult {
  std::vector<std::vector<TokenId>> tokens;  // per request
  std::vector<std::string> text;
  std::vector<std::vector<size_t>> step_sizes;  // tokens per delta, per request
  std::vector<FinishReason> finish;
  EngineMetricsSnapshot metrics;
};

RunResult run(DeepseekModel* model, const Tokenizer* tokenizer, const RunConfig& config,
              const std::vector<EngineRequest>& requests) {
  ModelExecutorOptions ex;
  ex.block_size = config.block_size;
  ex.num_blocks = config.num_blocks;
  ex.kv_dtype = config.kv_dtype;
  ex.num_speculative_tokens = config.num_speculative_tokens;
  ex.microbatches = config.microbatches;
  auto executor = ModelExecutor::create(model, ex);
  EXPECT_TRUE(executor.ok()) << executor.status().to_string();
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_num_batched_tokens = config.max_num_batched_tokens;
  eo.scheduler.max_model_len = 512;
  eo.scheduler.block_pool = {.num_blocks = config.num_blocks,
                             .block_size = config.block_size,
                             .enable_prefix_caching = true};
  eo.scheduler.num_speculative_tokens = config.num_speculative_tokens;
  eo.vocab_size = model->config().vocab_size;
  if (config.eos) eo.eos_token_ids = {*config.eos};
  auto engine = Engine::create(eo, std::move(executor).value(), tokenizer);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  (*engine)->start();

  std::mutex mutex;
  std::condition_variable cv;
  RunResult result;
  const size_t n = requests.size();
  result.tokens.resize(n);
  result.text.resize(n);
  result.step_sizes.resize(n);
  result.finish.resize(n);
  size_t finished = 0;
  for (size_t i = 0; i < n; ++i) {
    auto id = (*engine)->submit(requests[i], [&, i](RequestOutput out) {
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_TRUE(out.error.ok()) << out.error.to_string();
      for (const ChoiceDelta& d : out.choices) {
        result.tokens[i].insert(result.tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
        result.text[i] += d.text;
        if (!d.token_ids.empty()) result.step_sizes[i].push_back(d.token_ids.size());
        if (d.finish_reason) result.finish[i] = *d.finish_reason;
      }
      if (out.finished) {
        ++finished;
        cv.notify_all();
      }
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (config.one_at_a_time) {
      std::unique_lock<std::mutex> lock(mutex);
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return finished == i + 1; }));
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return finished == n; }));
  }
  result.metrics = (*engine)->metrics();
  (*engine)->stop();
  return result;
}

EngineRequest request(std::vector<TokenId> prompt, int32_t max_tokens, float temperature = 0.0f,
                      uint64_t seed = 0) {
  EngineRequest r;
  r.prompt_tokens = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.sampling.temperature = temperature;
  if (temperature > 0) r.params.sampling.seed = seed;
  return r;
}

std::vector<TokenId> prompt(int length, int salt, int vocab) {
  std::vector<TokenId> p;
  for (int i = 0; i < length; ++i) {
    p.push_back(static_cast<TokenId>(3 + (i * 7 + salt * 31) % (vocab - 3)));
  }
  return p;
}

class TinyPresetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() /
           ("peerserve_spec_tiny_" + std::to_string(::getpid()));
    TestModelOptions options;
    options.preset = TestModelPreset::kTiny;
    options.seed = 5;
    ASSERT_TRUE(write_test_model(dir_.string(), options).ok());
    ModelOptions model_options;
    model_options.num_threads = 1;
    model_options.gemm_precision = GemmPrecision::kFp32;
    model_options.attention_form = AttentionForm::kAbsorbed;
    auto model = DeepseekModel::load(dir_.string(), model_options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    ASSERT_TRUE((*model)->has_mtp());
    model_ = std::move(model).value();
  }
  static void TearDownTestSuite() {
    model_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::filesystem::path dir_;
  static std::unique_ptr<DeepseekModel> model_;
};
std::filesystem::path TinyPresetTest::dir_;
std::unique_ptr<DeepseekModel> TinyPresetTest::model_;

// A sequence's sampled tokens and drafts do not depend on the chunks before it in its step,
// in particular on chunks that draft nothing (their MTP pass only writes KV and returns no
// row, so the drafting chunks' MTP rows are not at their chunk indices).
TEST_F(TinyPresetTest, DraftsDoNotDependOnTheOtherChunksOfTheStep) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  ModelExecutorOptions options;
  options.block_size = 4;
  options.num_blocks = 16;
  options.kv_dtype = DType::kF32;
  options.num_speculative_tokens = 1;
  auto alone = ModelExecutor::create(model_.get(), options);
  auto shared = ModelExecutor::create(model_.get(), options);
  ASSERT_TRUE(alone.ok() && shared.ok());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<TokenId> x = prompt(10, 1, vocab), y = prompt(12, 2, vocab);
  const std::vector<BlockId> x_blocks = {0, 1, 2, 3}, y_blocks = {4, 5, 6, 7};

  auto chunk = [](SequenceId id, int64_t start, std::vector<TokenId> tokens,
                  const std::vector<BlockId>& blocks) {
    ScheduledChunk c;
    c.seq_id = id;
    c.start_pos = start;
    c.tokens = std::move(tokens);
    c.block_table = blocks;
    return c;
  };
  // Step 1: x's whole prompt (samples, drafts one); in the shared executor after the first
  // half of y's prompt (neither samples nor drafts).
  ScheduledChunk x1 = chunk(1, 0, x, x_blocks);
  x1.sample = true;
  x1.sampling = &greedy;
  x1.num_lookahead = 1;
  ScheduledChunk y1 = chunk(2, 0, {y.begin(), y.begin() + 6}, y_blocks);
  y1.next_token = y[6];
  StepPlan plan_alone, plan_shared;
  plan_alone.speculative = plan_shared.speculative = true;
  plan_alone.chunks = {x1};
  plan_shared.chunks = {y1, x1};
  auto a1 = (*alone)->execute(plan_alone);
  auto s1 = (*shared)->execute(plan_shared);
  ASSERT_TRUE(a1.ok() && s1.ok());
  ASSERT_EQ(a1->chunks[0].tokens.size(), 1u);
  ASSERT_EQ(a1->chunks[0].drafts.size(), 1u);
  ASSERT_EQ(s1->chunks[1].tokens.size(), 1u);
  ASSERT_EQ(s1->chunks[1].drafts.size(), 1u);
  EXPECT_EQ(s1->chunks[1].tokens[0].token, a1->chunks[0].tokens[0].token);
  EXPECT_EQ(s1->chunks[1].drafts[0].token, a1->chunks[0].drafts[0].token);
  EXPECT_TRUE(s1->chunks[0].tokens.empty() && s1->chunks[0].drafts.empty());

  // Step 2: x verifies its draft; y's second half samples but drafts nothing.
  const std::vector<TokenId> generated = {a1->chunks[0].tokens[0].token};
  const std::vector<DraftToken> drafts = {a1->chunks[0].drafts[0]};
  ScheduledChunk x2 = chunk(1, 10, {generated[0], drafts[0].token}, x_blocks);
  x2.sample = true;
  x2.sampling = &greedy;
  x2.generated = generated;
  x2.drafts = drafts;
  x2.num_lookahead = 1;
  ScheduledChunk y2 = chunk(2, 6, {y.begin() + 6, y.end()}, y_blocks);
  y2.sample = true;
  y2.sampling = &greedy;
  plan_alone.chunks = {x2};
  plan_shared.chunks = {y2, x2};
  auto a2 = (*alone)->execute(plan_alone);
  auto s2 = (*shared)->execute(plan_shared);
  ASSERT_TRUE(a2.ok() && s2.ok());
  ASSERT_FALSE(a2->chunks[0].drafts.empty());
  ASSERT_EQ(s2->chunks[1].tokens.size(), a2->chunks[0].tokens.size());
  for (size_t i = 0; i < a2->chunks[0].tokens.size(); ++i) {
    EXPECT_EQ(s2->chunks[1].tokens[i].token, a2->chunks[0].tokens[i].token) << i;
  }
  ASSERT_EQ(s2->chunks[1].drafts.size(), a2->chunks[0].drafts.size());
  EXPECT_EQ(s2->chunks[1].drafts[0].token, a2->chunks[0].drafts[0].token);
  EXPECT_EQ(s2->chunks[0].tokens.size(), 1u);
  EXPECT_TRUE(s2->chunks[0].drafts.empty());
}

TEST_F(TinyPresetTest, GreedyTokensEqualNonSpeculativeWithPreemption) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(prompt(5 + 7 * i, i, vocab), 20));
  const RunResult reference = run(model_.get(), nullptr, RunConfig{}, requests);
  for (int32_t k : {1, 2}) {
    RunConfig config;
    config.num_speculative_tokens = k;
    const RunResult roomy = run(model_.get(), nullptr, config, requests);
    config.num_blocks = 28;  // six sequences of up to 60 tokens in 112 slots: preemption
    const RunResult tight = run(model_.get(), nullptr, config, requests);
    EXPECT_GT(tight.metrics.scheduler.num_preemptions, 0) << "K=" << k;
    EXPECT_GT(roomy.metrics.spec_decode_num_draft_tokens, 0) << "K=" << k;
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(reference.tokens[i].size(), 20u);
      EXPECT_EQ(roomy.tokens[i], reference.tokens[i]) << "K=" << k << " request " << i;
      EXPECT_EQ(tight.tokens[i], reference.tokens[i]) << "K=" << k << " request " << i;
    }
  }
}

// Under expert parallelism every rank must join every MoE exchange: with speculation on,
// every step runs the MTP layer exactly K times, whether this rank drafts (a prefill step,
// a sequence at its lookahead limit, a dummy step of an idle rank) or not, and the tokens
// are unchanged, with one microbatch or two (the pipeline, which under a collective backend
// splits every step, then the MTP passes whole). (Without lock-step a step runs the MTP
// layer only while a sequence drafts on, fewer times: the counts below tell the two apart.)
TEST_F(TinyPresetTest, UnderLockStepEveryStepRunsTheMtpLayerKTimes) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const int64_t mtp_layer = model_->config().num_hidden_layers;
  const int64_t first_moe = model_->config().first_k_dense_replace;
  ASSERT_LT(first_moe, mtp_layer);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(request(prompt(6 + 9 * i, i, vocab), 12));
  const RunResult reference = run(model_.get(), nullptr, RunConfig{}, requests);

  const std::shared_ptr<ExpertBackend> local = model_->expert_backend();
  auto counting = std::make_shared<testing::ObservingBackend>(local);
  model_->set_expert_backend(counting);
  struct Restore {
    DeepseekModel* model;
    std::shared_ptr<ExpertBackend> backend;
    ~Restore() { model->set_expert_backend(backend); }
  } restore{model_.get(), local};

  for (int microbatches : {1, 2}) {
    for (int32_t k : {1, 2, 3}) {
      for (bool collective : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "microbatches " << microbatches << ", K=" << k
                                          << (collective ? ", lock-step" : ""));
        counting->is_collective = collective;
        counting->clear();
        RunConfig config;
        config.num_speculative_tokens = k;
        config.microbatches = microbatches;
        config.max_num_batched_tokens = 16;  // the longer prompts prefill in several chunks
        const RunResult result = run(model_.get(), nullptr, config, requests);
        for (size_t i = 0; i < requests.size(); ++i) {
          EXPECT_EQ(result.tokens[i], reference.tokens[i]) << "request " << i;
        }
        const int64_t steps = result.metrics.steps_total;
        ASSERT_GT(steps, 0);
        if (collective) {
          // Every main MoE layer once per microbatch (the second possibly empty), the MTP
          // layer K times.
          EXPECT_EQ(counting->dispatches(first_moe), microbatches * steps);
          EXPECT_EQ(counting->dispatches(mtp_layer), k * steps);
        } else if (k > 1) {
          EXPECT_LT(counting->dispatches(mtp_layer), k * steps);
        }
      }
    }
  }

  // A dummy step (an idle rank's empty plan) joins the main layers' and K MTP exchanges.
  counting->is_collective = true;
  for (bool speculative_plan : {true, false}) {
    ModelExecutorOptions options;
    options.block_size = 4;
    options.num_blocks = 4;
    options.num_speculative_tokens = 2;
    auto executor = ModelExecutor::create(model_.get(), options);
    ASSERT_TRUE(executor.ok()) << executor.status().to_string();
    counting->clear();
    StepPlan empty;
    empty.speculative = speculative_plan;
    auto result = (*executor)->execute(empty);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    EXPECT_TRUE(result->chunks.empty());
    for (int64_t layer = first_moe; layer < mtp_layer; ++layer) {
      EXPECT_EQ(counting->dispatches(layer), 1) << "layer " << layer;
    }
    EXPECT_EQ(counting->dispatches(mtp_layer), 2) << "speculative plan " << speculative_plan;
  }
}

// A seeded request draws the same tokens when its positions are verified against the same
// drafts: here each request runs alone, once with its prompt in one chunk and once chunked
// by a budget of 7 tokens (still room for both drafts of a decode step). Under other loads
// the drafts a position gets may differ, and with them the draws (docs/speculative_decoding.md,
// "Limits"); a different seed draws differently.
TEST_F(TinyPresetTest, SeededSamplingReproduces) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  std::vector<EngineRequest> requests, reseeded;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(request(prompt(9 + i, 40 + i, vocab), 16, 0.9f, 7 + i));
    reseeded.push_back(request(prompt(9 + i, 40 + i, vocab), 16, 0.9f, 1007 + i));
  }
  RunConfig config;
  config.num_speculative_tokens = 2;
  config.one_at_a_time = true;
  const RunResult a = run(model_.get(), nullptr, config, requests);
  const RunResult c = run(model_.get(), nullptr, config, reseeded);
  config.max_num_batched_tokens = 7;
  const RunResult b = run(model_.get(), nullptr, config, requests);
  ASSERT_GT(b.metrics.spec_decode_num_draft_tokens, 0);
  // All four at once in a budget of 6 tokens: which positions get drafts now depends on the
  // load (decodes and prefill chunks take the budget first). The tokens must not.
  config.one_at_a_time = false;
  config.max_num_batched_tokens = 6;
  const RunResult loaded = run(model_.get(), nullptr, config, requests);
  // Without speculation: the same tokens (every emitted token is ordinary sampling's).
  RunConfig off;
  off.one_at_a_time = true;
  const RunResult plain = run(model_.get(), nullptr, off, requests);
  int differing = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(a.tokens[i].size(), 16u);
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "request " << i;
    EXPECT_EQ(a.tokens[i], loaded.tokens[i]) << "request " << i;
    EXPECT_EQ(a.tokens[i], plain.tokens[i]) << "request " << i;
    differing += a.tokens[i] != c.tokens[i];
  }
  EXPECT_GT(differing, 0) << "the seed changed no draw";
}

// The shipped model: a trained MTP head accepts most drafts, so runs of accepted drafts are
// long enough to put stops inside them.
class ShippedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = PEERSERVE_SHIPPED_MODEL_DIR;
    ModelOptions model_options;
    model_options.num_threads = 1;
    auto model = DeepseekModel::load(dir, model_options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(model).value();
    auto tokenizer = Tokenizer::load_from_dir(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer).value());
  }
  static void TearDownTestSuite() {
    model_.reset();
    tokenizer_.reset();
  }
  // The serving defaults, except a token budget that holds every prompt whole. Requests
  // arrive while the engine runs, so which step prefills which prompt depends on timing
  // (and on the drafts' share of the budget); a prompt split in two can put some of its rows
  // in the absorbed attention form instead of the plain one (kAuto chooses by chunk size,
  // model/mla_attention.h), and in bf16 the two forms agree to ~4e-3, not bitwise, which
  // can flip a greedy token (seen once, in a loaded ASan run). Whole prompts are always in
  // the plain form and every decode or verification chunk in the absorbed one, so the
  // exactness argument above holds. Chunked prefills are covered by the tiny-preset tests.
  static RunConfig config(int32_t num_speculative_tokens) {
    RunConfig c;
    c.kv_dtype = DType::kBF16;
    c.block_size = 16;
    c.max_num_batched_tokens = 256;
    c.num_speculative_tokens = num_speculative_tokens;
    return c;
  }
  static std::vector<EngineRequest> requests() {
    std::vector<EngineRequest> out;
    const char* prompts[] = {"The GNU General Public License is a free, copyleft license for",
                             "Copyright (C) 2007 Free Software Foundation, Inc.",
                             "This program is distributed in the hope that it will be useful,",
                             "You should have received a copy of the",
                             "Permission is hereby granted, free of charge, to any person"};
    for (const char* p : prompts) {
      auto ids = tokenizer_->encode(p);
      EXPECT_TRUE(ids.ok());
      out.push_back(request(*ids, 40));
    }
    return out;
  }
  static std::unique_ptr<DeepseekModel> model_;
  static std::unique_ptr<Tokenizer> tokenizer_;
};
std::unique_ptr<DeepseekModel> ShippedModelTest::model_;
std::unique_ptr<Tokenizer> ShippedModelTest::tokenizer_;

TEST_F(ShippedModelTest, GreedyTokensEqualNonSpeculative) {
  const std::vector<EngineRequest> reqs = requests();
  const RunConfig off = config(0);
  const RunResult reference = run(model_.get(), tokenizer_.get(), off, reqs);
  for (int32_t k : {1, 2}) {
    const RunConfig on = config(k);
    const RunResult spec = run(model_.get(), tokenizer_.get(), on, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(spec.tokens[i], reference.tokens[i]) << "K=" << k << " request " << i;
      EXPECT_EQ(spec.text[i], reference.text[i]) << "K=" << k << " request " << i;
    }
    const EngineMetricsSnapshot& m = spec.metrics;
    EXPECT_GT(m.spec_decode_num_accepted_tokens, m.spec_decode_num_draft_tokens / 2)
        << "K=" << k << ": a trained MTP head accepts most drafts";
    EXPECT_EQ(m.spec_decode_accepted_per_position[0] +
                  (k > 1 ? m.spec_decode_accepted_per_position[1] : 0),
              m.spec_decode_num_accepted_tokens);
    EXPECT_EQ(static_cast<int64_t>(m.spec_decode_acceptance_length.count()),
              m.spec_decode_num_drafts);
    EXPECT_LT(m.steps_total, reference.metrics.steps_total) << "K=" << k;
    // One inter-token latency per step that brought a request tokens, as vLLM counts them
    // (each accepted draft was a sample of 0 s).
    uint64_t gaps = 0;
    for (const auto& sizes : spec.step_sizes) gaps += sizes.empty() ? 0 : sizes.size() - 1;
    EXPECT_EQ(m.inter_token_latency.count(), gaps) << "K=" << k;
  }
}

// Seeded sampled requests, all at once: the tokens are those of non-speculative decoding
// with the same seeds (the verifier emits ordinary sampling's token; the draft only decides
// whether it came a step early), with a trained head that accepts many of the drafts.
TEST_F(ShippedModelTest, SeededSampledTokensEqualNonSpeculative) {
  std::vector<EngineRequest> reqs = requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].params.sampling.temperature = 0.8f;
    reqs[i].params.sampling.top_p = 0.95f;
    reqs[i].params.sampling.seed = 100 + i;
  }
  const RunResult reference = run(model_.get(), tokenizer_.get(), config(0), reqs);
  for (int32_t k : {1, 2}) {
    const RunResult spec = run(model_.get(), tokenizer_.get(), config(k), reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(spec.tokens[i], reference.tokens[i]) << "K=" << k << " request " << i;
    }
    EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens,
              spec.metrics.spec_decode_num_draft_tokens / 3)
        << "K=" << k;
  }
}

// serve's default drafter: the MTP layer in INT8 beside the BF16 main model. Drafts change, the
// greedy output does not, and the drafts still mostly pass (measured: 81.4% at batch 1, the
// same as the BF16 drafter, bench/model speculative_decode).
TEST_F(ShippedModelTest, Int8DrafterKeepsTheGreedyTokens) {
  ModelOptions model_options;
  model_options.num_threads = 1;
  model_options.quantize_draft = WeightQuantization::kInt8;
  auto drafter = DeepseekModel::load(PEERSERVE_SHIPPED_MODEL_DIR, model_options);
  ASSERT_TRUE(drafter.ok()) << drafter.status().to_string();
  const std::vector<EngineRequest> reqs = requests();
  const RunResult reference = run(model_.get(), tokenizer_.get(), config(0), reqs);
  for (int32_t k : {1, 2}) {
    const RunResult spec = run(drafter->get(), tokenizer_.get(), config(k), reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(spec.tokens[i], reference.tokens[i]) << "K=" << k << " request " << i;
    }
    EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens,
              spec.metrics.spec_decode_num_draft_tokens / 2)
        << "K=" << k;
  }
}

TEST_F(ShippedModelTest, StopsInsideAnAcceptedRun) {
  const std::vector<EngineRequest> reqs = requests();
  RunConfig on = config(2);
  const RunResult spec = run(model_.get(), tokenizer_.get(), on, reqs);
  // Find a request and a token that was an accepted draft (not the last token of its step)
  // and does not occur earlier in that request's output.
  size_t which = reqs.size();
  size_t at = 0;
  for (size_t i = 0; i < reqs.size() && which == reqs.size(); ++i) {
    size_t offset = 0;
    for (size_t step : spec.step_sizes[i]) {
      for (size_t j = 0; j + 1 < step; ++j) {
        const size_t pos = offset + j;
        const TokenId t = spec.tokens[i][pos];
        if (pos >= 3 && std::find(spec.tokens[i].begin(), spec.tokens[i].begin() + pos, t) ==
                            spec.tokens[i].begin() + pos) {
          which = i;
          at = pos;
          break;
        }
      }
      if (which != reqs.size()) break;
      offset += step;
    }
  }
  ASSERT_NE(which, reqs.size()) << "no accepted draft to stop at";
  const TokenId stop = spec.tokens[which][at];
  const std::vector<TokenId> expected(spec.tokens[which].begin(),
                                      spec.tokens[which].begin() + at + 1);

  for (int variant = 0; variant < 3; ++variant) {
    std::vector<EngineRequest> one = {reqs[which]};
    RunConfig off = on;
    off.num_speculative_tokens = 0;
    if (variant == 0) {
      one[0].params.stop_token_ids = {stop};
    } else if (variant == 1) {
      one[0].params.ignore_eos = false;
      on.eos = stop;
      off.eos = stop;
    } else {
      auto piece = tokenizer_->decode({&stop, 1});
      ASSERT_TRUE(piece.ok());
      if (piece->empty()) continue;
      one[0].params.stop_strings = {*piece};
    }
    const RunResult a = run(model_.get(), tokenizer_.get(), off, one);
    const RunResult b = run(model_.get(), tokenizer_.get(), on, one);
    EXPECT_EQ(b.tokens[0], a.tokens[0]) << "variant " << variant;
    EXPECT_EQ(b.text[0], a.text[0]) << "variant " << variant;
    EXPECT_EQ(b.finish[0], FinishReason::kStop) << "variant " << variant;
    if (variant < 2) {
      EXPECT_EQ(b.tokens[0], expected) << "variant " << variant;
    }
    on.eos.reset();
  }
}

}  // namespace
}  // namespace peerserve
