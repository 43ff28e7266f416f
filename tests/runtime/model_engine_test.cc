// The engine with the real model (tiny preset, fp32 GEMMs and KV, one attention form):
// batched == sequential (greedy and seeded sampling), preemption + recompute give the same
// tokens, and a prefix-cache hit gives the same tokens as a cold run.
//
// Exactness argument: the GEMM kernels are batch-invariant and attention is computed per
// query, so a sequence's logits do not depend on the other sequences of a step or on how
// its prompt was chunked, provided every chunk uses the same attention form (forced here;
// kAuto may pick different forms for different chunk sizes, which is equal only up to
// rounding). Hence token sequences must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "model/checkpoint/test_model.h"
#include "model/deepseek_model.h"
#include "runtime/engine.h"
#include "runtime/model_executor.h"

namespace peerserve {
namespace {

struct RunConfig {
  int32_t max_num_seqs = 8;
  int32_t max_num_batched_tokens = 64;
  int32_t num_blocks = 256;
  int32_t block_size = 4;
  bool prefix_caching = true;
  int microbatches = 1;
  MicrobatchSplit microbatch_split = MicrobatchSplit::kAlways;
  std::vector<TokenId> eos_token_ids;
};

struct RunResult {
  std::vector<std::vector<TokenId>> tokens;  // per request, in submission order
  std::vector<int64_t> cached_prompt_tokens;
  EngineMetricsSnapshot metrics;
};

class ModelEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<std::filesystem::path>(
        std::filesystem::temp_directory_path() /
        ("peerserve_tiny_engine_" + std::to_string(::getpid())));
    TestModelOptions options;
    options.preset = TestModelPreset::kTiny;
    options.seed = 11;
    ASSERT_TRUE(write_test_model(dir_->string(), options).ok());
    ModelOptions model_options;
    model_options.num_threads = 1;
    model_options.gemm_precision = GemmPrecision::kFp32;
    model_options.attention_form = AttentionForm::kAbsorbed;
    auto model = DeepseekModel::load(dir_->string(), model_options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(model).value();
  }
  static void TearDownTestSuite() {
    model_.reset();
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    dir_.reset();
  }

  // Submits every request at once (or one after another when `sequential`), waits for all.
  static RunResult run(const RunConfig& config, const std::vector<EngineRequest>& requests,
                       bool sequential) {
    ModelExecutorOptions ex;
    ex.block_size = config.block_size;
    ex.num_blocks = config.num_blocks;
    ex.kv_dtype = DType::kF32;
    ex.microbatches = config.microbatches;
    ex.microbatch_split = config.microbatch_split;
    auto executor = ModelExecutor::create(model_.get(), ex);
    EXPECT_TRUE(executor.ok()) << executor.status().to_string();
    EngineOptions eo;
    eo.scheduler.max_num_seqs = config.max_num_seqs;
    eo.scheduler.max_num_batched_tokens = config.max_num_batched_tokens;
    eo.scheduler.max_model_len = 256;
    eo.scheduler.block_pool = {.num_blocks = config.num_blocks,
                               .block_size = config.block_size,
                               .enable_prefix_caching = config.prefix_caching};
    eo.vocab_size = model_->config().vocab_size;
    eo.eos_token_ids = config.eos_token_ids;
    auto engine = Engine::create(eo, std::move(executor).value(), nullptr);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    (*engine)->start();

    std::mutex mutex;
    std::condition_variable cv;
    RunResult result;
    result.tokens.resize(requests.size());
    result.cached_prompt_tokens.resize(requests.size());
    int finished = 0;
    auto submit = [&](size_t i) {
      auto id = (*engine)->submit(requests[i], [&, i](RequestOutput out) {
        std::lock_guard<std::mutex> lock(mutex);
        for (const ChoiceDelta& d : out.choices) {
          result.tokens[i].insert(result.tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
        }
        EXPECT_TRUE(out.error.ok()) << out.error.to_string();
        if (out.finished) {
          result.cached_prompt_tokens[i] = out.usage.cached_prompt_tokens;
          ++finished;
          cv.notify_all();
        }
      });
      EXPECT_TRUE(id.ok()) << id.status().to_string();
    };
    auto wait_for = [&](int n) {
      std::unique_lock<std::mutex> lock(mutex);
      return cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished >= n; });
    };
    for (size_t i = 0; i < requests.size(); ++i) {
      submit(i);
      if (sequential) {
        EXPECT_TRUE(wait_for(static_cast<int>(i) + 1));
      }
    }
    EXPECT_TRUE(wait_for(static_cast<int>(requests.size())));
    result.metrics = (*engine)->metrics();
    (*engine)->stop();
    return result;
  }

  static EngineRequest request(std::vector<TokenId> prompt, int32_t max_tokens,
                               float temperature = 0.0f, uint64_t seed = 0) {
    EngineRequest r;
    r.prompt_tokens = std::move(prompt);
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.sampling.temperature = temperature;
    if (temperature > 0) r.params.sampling.seed = seed;
    return r;
  }

  static std::vector<TokenId> prompt(int length, int salt) {
    std::vector<TokenId> p;
    for (int i = 0; i < length; ++i)
      p.push_back(static_cast<TokenId>(3 + (i * 7 + salt * 31) % 250));
    return p;
  }

  static std::unique_ptr<std::filesystem::path> dir_;
  static std::unique_ptr<DeepseekModel> model_;
};

std::unique_ptr<std::filesystem::path> ModelEngineTest::dir_;
std::unique_ptr<DeepseekModel> ModelEngineTest::model_;

TEST_F(ModelEngineTest, BatchedEqualsSequentialGreedyAndSeeded) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(prompt(5 + 9 * i, i), 12));
  requests.push_back(request(prompt(20, 50), 12, 0.8f, 1234));
  requests.push_back(request(prompt(33, 51), 12, 1.0f, 99));
  RunConfig sequential_config;
  sequential_config.max_num_seqs = 1;
  sequential_config.max_num_batched_tokens = 256;  // whole prompts in one chunk
  RunResult sequential = run(sequential_config, requests, /*sequential=*/true);
  RunConfig batched_config;
  batched_config.max_num_batched_tokens = 16;  // chunked prefill mixed with decodes
  RunResult batched = run(batched_config, requests, /*sequential=*/false);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(sequential.tokens[i].size(), 12u);
    EXPECT_EQ(batched.tokens[i], sequential.tokens[i]) << "request " << i;
  }
}

// Under ignore_eos, EOS is still kept out of the first min_tokens tokens, as vLLM's
// min_tokens processor does: the greedy token at position 1 made the EOS id cannot come out
// before position 4, and comes out as usual without min_tokens.
TEST_F(ModelEngineTest, MinTokensKeepsEosOutUnderIgnoreEos) {
  const RunResult plain = run(RunConfig{}, {request(prompt(9, 3), 6)}, false);
  ASSERT_EQ(plain.tokens[0].size(), 6u);
  RunConfig with_eos;
  with_eos.eos_token_ids = {plain.tokens[0][1]};
  EXPECT_EQ(run(with_eos, {request(prompt(9, 3), 6)}, false).tokens[0], plain.tokens[0]);
  EngineRequest held = request(prompt(9, 3), 6);
  held.params.sampling.min_tokens = 4;
  const RunResult r = run(with_eos, {held}, false);
  ASSERT_EQ(r.tokens[0].size(), 6u);
  EXPECT_EQ(std::count(r.tokens[0].begin(), r.tokens[0].begin() + 4, plain.tokens[0][1]), 0);
}

// vLLM's allowed_token_ids: greedy and sampled requests draw from the set alone.
TEST_F(ModelEngineTest, AllowedTokenIdsKeepSamplingToTheSet) {
  const std::vector<TokenId> allowed = {11, 22, 33, 44};
  const RunResult plain = run(RunConfig{}, {request(prompt(9, 4), 6)}, false);
  EXPECT_FALSE(std::all_of(plain.tokens[0].begin(), plain.tokens[0].end(), [&](TokenId t) {
    return std::find(allowed.begin(), allowed.end(), t) != allowed.end();
  })) << "the model alone already keeps to the set: the test shows nothing";
  EngineRequest greedy = request(prompt(9, 4), 6);
  greedy.params.sampling.allowed_token_ids = allowed;
  EngineRequest sampled = request(prompt(9, 4), 6, 1.0f, 7);
  sampled.params.sampling.allowed_token_ids = allowed;
  const RunResult r = run(RunConfig{}, {greedy, sampled}, false);
  for (const std::vector<TokenId>& tokens : r.tokens) {
    ASSERT_EQ(tokens.size(), 6u);
    for (const TokenId t : tokens) {
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t;
    }
  }
}

TEST_F(ModelEngineTest, TwoMicrobatchesGiveTheSameTokensAsOne) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(prompt(7 + 5 * i, 200 + i), 14));
  requests.push_back(request(prompt(19, 250), 14, 0.9f, 77));
  RunConfig one;
  one.max_num_batched_tokens = 24;  // chunked prefills sharing steps with decodes
  RunResult reference = run(one, requests, /*sequential=*/false);
  RunConfig two = one;
  two.microbatches = 2;
  RunResult pipelined = run(two, requests, /*sequential=*/false);
  RunConfig two_tight = two;
  two_tight.num_blocks = 20;  // preemption under the pipeline too
  RunResult squeezed = run(two_tight, requests, /*sequential=*/false);
  EXPECT_GT(squeezed.metrics.scheduler.num_preemptions, 0);
  RunConfig measured = two;  // the default policy: some steps split, some not
  measured.microbatch_split = MicrobatchSplit::kMeasured;
  RunResult chosen = run(measured, requests, /*sequential=*/false);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(reference.tokens[i].size(), 14u);
    EXPECT_EQ(pipelined.tokens[i], reference.tokens[i]) << "request " << i;
    EXPECT_EQ(squeezed.tokens[i], reference.tokens[i]) << "request " << i;
    EXPECT_EQ(chosen.tokens[i], reference.tokens[i]) << "request " << i;
  }
}

TEST_F(ModelEngineTest, PreemptionAndResumeGiveTheSameTokens) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(prompt(10 + i, 100 + i), 30));
  RunConfig roomy;
  RunResult reference = run(roomy, requests, /*sequential=*/false);
  EXPECT_EQ(reference.metrics.scheduler.num_preemptions, 0);
  RunConfig tight;
  tight.num_blocks = 24;  // 96 token slots for six sequences growing to 40-45 tokens
  for (bool caching : {false, true}) {
    tight.prefix_caching = caching;
    RunResult squeezed = run(tight, requests, /*sequential=*/false);
    EXPECT_GT(squeezed.metrics.scheduler.num_preemptions, 0) << "caching=" << caching;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(squeezed.tokens[i], reference.tokens[i])
          << "request " << i << " caching=" << caching;
    }
  }
}

TEST_F(ModelEngineTest, PrefixCacheHitGivesTheSameTokens) {
  std::vector<TokenId> shared = prompt(37, 7);
  std::vector<TokenId> a = shared, b = shared;
  a.push_back(200);
  b.push_back(201);
  b.push_back(202);
  RunConfig cold;
  cold.prefix_caching = false;
  RunResult b_cold = run(cold, {request(b, 10)}, true);
  RunResult warm = run(RunConfig{}, {request(a, 10), request(b, 10)}, /*sequential=*/true);
  // 37 shared tokens = 9 full blocks of 4.
  EXPECT_EQ(warm.cached_prompt_tokens[1], 36);
  EXPECT_EQ(warm.tokens[1], b_cold.tokens[0]);
  EXPECT_GT(warm.metrics.scheduler.pool.prefix_hit_tokens, 0);
}

}  // namespace
}  // namespace peerserve
