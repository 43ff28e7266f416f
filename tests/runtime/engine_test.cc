// The engine loop with the paged fake model (tests/runtime/fake_executor.h) and the small
// byte-level test tokenizer: text, stop strings across token boundaries, stop token ids,
// ignore_eos, n > 1, logprobs, usage counts, aborts, queue limits and executor failures.
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "model/checkpoint/test_tokenizer.h"
#include "tests/runtime/fake_executor.h"

namespace peerserve {
namespace {

using testing::FakeExecutor;
using testing::reference_generate;

// Collects every output of every request; tests wait for a request's last output.
class Collector {
 public:
  Engine::OutputSink sink() {
    return [this](RequestOutput out) {
      std::lock_guard<std::mutex> lock(mutex_);
      const RequestId id = out.request_id;
      const bool finished = out.finished;
      outputs_[id].push_back(std::move(out));
      if (finished) ++num_finished_;
      cv_.notify_all();
    };
  }
  // The outputs of `id` once it finished (empty vector on a 20 s timeout).
  std::vector<RequestOutput> wait(RequestId id) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      auto it = outputs_.find(id);
      return it != outputs_.end() && !it->second.empty() && it->second.back().finished;
    });
    return done ? outputs_[id] : std::vector<RequestOutput>{};
  }
  bool wait_first(RequestId id) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return outputs_.count(id) > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<RequestId, std::vector<RequestOutput>> outputs_;
  int num_finished_ = 0;
};

// One choice's outputs put together.
struct ChoiceResult {
  std::vector<TokenId> tokens;
  std::string text;
  std::vector<SampledToken> logprobs;
  std::optional<FinishReason> finish;
  std::optional<std::string> stop_string;
  std::optional<TokenId> stop_token;
  int num_finish_marks = 0;
};

std::map<int32_t, ChoiceResult> assemble(const std::vector<RequestOutput>& outputs) {
  std::map<int32_t, ChoiceResult> choices;
  for (const RequestOutput& out : outputs) {
    for (const ChoiceDelta& d : out.choices) {
      ChoiceResult& c = choices[d.index];
      c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      c.text += d.text;
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finish_reason) {
        c.finish = d.finish_reason;
        ++c.num_finish_marks;
      }
      if (d.stop_string) c.stop_string = d.stop_string;
      if (d.stop_token) c.stop_token = d.stop_token;
    }
  }
  return choices;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::from_sources({test_tokenizer_json(), test_tokenizer_config_json()});
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tok).value());
    // The fake model writes lowercase letters and spaces, so the text is plain ASCII.
    for (char c : std::string("abcdefghij ")) {
      auto ids = tokenizer_->encode(std::string(1, c), {.add_special_tokens = false});
      ASSERT_TRUE(ids.ok());
      ASSERT_EQ(ids->size(), 1u);
      alphabet_.push_back((*ids)[0]);
    }
  }

  void start(int32_t num_blocks = 256, int32_t max_num_seqs = 8, int32_t max_waiting = 1000,
             std::optional<TokenId> eos = std::nullopt) {
    EngineOptions options;
    options.scheduler.max_num_seqs = max_num_seqs;
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_model_len = 512;
    options.scheduler.max_waiting_seqs = max_waiting;
    options.scheduler.block_pool = {
        .num_blocks = num_blocks, .block_size = 4, .enable_prefix_caching = true};
    if (eos) options.eos_token_ids = {*eos};
    options.vocab_size = tokenizer_->vocab_size();
    options.lockstep = lockstep_;
    auto executor = std::make_unique<FakeExecutor>(num_blocks, 4, alphabet_);
    executor_ = executor.get();
    auto engine = Engine::create(options, std::move(executor), tokenizer_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    engine_ = std::move(engine).value();
    engine_->start();
  }

  std::vector<TokenId> prompt(const std::string& text) {
    return tokenizer_->encode(text, {.add_special_tokens = false}).value();
  }
  std::string decode(const std::vector<TokenId>& ids) { return tokenizer_->decode(ids).value(); }

  RequestId submit(std::vector<TokenId> prompt_tokens, GenerationParams params) {
    auto id = engine_->submit({std::move(prompt_tokens), std::move(params)}, collector_.sink());
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : 0;
  }

  // Waits until the engine reports no used KV blocks (bounded).
  bool wait_idle_blocks() {
    for (int i = 0; i < 2000; ++i) {
      auto m = engine_->metrics();
      if (m.scheduler.num_used_blocks == 0 && m.scheduler.num_running == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // EngineOptions::lockstep for the next start() (none: no group).
  std::function<Result<bool>(int64_t rows)> lockstep_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<TokenId> alphabet_;
  FakeExecutor* executor_ = nullptr;
  std::unique_ptr<Engine> engine_;
  Collector collector_;
};

GenerationParams greedy(int32_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

TEST_F(EngineTest, GeneratesTheReferenceTokensTextAndUsage) {
  start();
  std::vector<TokenId> p = prompt("hello world");
  RequestId id = submit(p, greedy(12));
  auto outputs = collector_.wait(id);
  ASSERT_FALSE(outputs.empty());
  auto choices = assemble(outputs);
  ASSERT_EQ(choices.size(), 1u);
  std::vector<TokenId> ref = reference_generate(p, 12, alphabet_, std::nullopt);
  EXPECT_EQ(choices[0].tokens, ref);
  EXPECT_EQ(choices[0].text, decode(ref));
  EXPECT_EQ(choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(choices[0].num_finish_marks, 1);
  EXPECT_TRUE(choices[0].logprobs.empty());
  const Usage& usage = outputs.back().usage;
  EXPECT_EQ(usage.prompt_tokens, static_cast<int64_t>(p.size()));
  EXPECT_EQ(usage.completion_tokens, 12);
  EXPECT_TRUE(wait_idle_blocks());
  auto m = engine_->metrics();
  EXPECT_EQ(m.generation_tokens_total, 12);
  EXPECT_EQ(m.prompt_tokens_total, static_cast<int64_t>(p.size()));
  EXPECT_EQ(m.time_to_first_token.count(), 1u);
  EXPECT_EQ(m.inter_token_latency.count(), 11u);
  EXPECT_EQ(m.e2e_request_latency.count(), 1u);
}

// A request's default_max_tokens (completions: 16) applies within the context: a prompt 5
// tokens short of max_model_len gets 5, not a "too long" error; a short prompt gets 16.
TEST_F(EngineTest, DefaultMaxTokensStaysWithinTheContext) {
  start();
  GenerationParams params = greedy(1);
  params.max_tokens.reset();
  params.default_max_tokens = 16;
  const std::vector<TokenId> short_prompt = prompt("abc");
  auto choices = assemble(collector_.wait(submit(short_prompt, params)));
  EXPECT_EQ(choices[0].tokens.size(), 16u);
  EXPECT_EQ(choices[0].finish, FinishReason::kLength);
  std::vector<TokenId> near_end;
  while (near_end.size() < 512 - 5) {
    near_end.push_back(short_prompt[near_end.size() % short_prompt.size()]);
  }
  choices = assemble(collector_.wait(submit(near_end, params)));
  EXPECT_EQ(choices[0].tokens.size(), 5u);
  EXPECT_TRUE(wait_idle_blocks());
}

TEST_F(EngineTest, StopStringAcrossTokenBoundaries) {
  start();
  std::vector<TokenId> p = prompt("abc def");
  std::vector<TokenId> ref = reference_generate(p, 40, alphabet_, std::nullopt);
  const std::string full = decode(ref);
  // A 3-character stop string taken from the middle of the text: each character is its own
  // token, so the match always spans token boundaries.
  const std::string stop = full.substr(10, 3);
  const size_t cut = full.find(stop);
  GenerationParams params = greedy(40);
  params.stop_strings = {stop, "not-there"};
  RequestId id = submit(p, params);
  auto choices = assemble(collector_.wait(id));
  EXPECT_EQ(choices[0].text, full.substr(0, cut));
  EXPECT_EQ(choices[0].finish, FinishReason::kStop);
  EXPECT_EQ(choices[0].stop_string, stop);
  // Tokens up to and including the one that completed the stop string.
  EXPECT_EQ(choices[0].tokens, std::vector<TokenId>(ref.begin(), ref.begin() + cut + 3));

  params.include_stop_str_in_output = true;
  id = submit(p, params);
  choices = assemble(collector_.wait(id));
  EXPECT_EQ(choices[0].text, full.substr(0, cut + 3));
  EXPECT_TRUE(wait_idle_blocks());
}

// As in vLLM's detokenizer, no stop string ends in the first min_tokens tokens' text, but
// one that ends later may start there. Each character is a token here.
TEST_F(EngineTest, StopStringsAroundMinTokens) {
  start();
  std::vector<TokenId> p = prompt("min tokens");
  std::vector<TokenId> ref = reference_generate(p, 40, alphabet_, std::nullopt);
  const std::string full = decode(ref);
  constexpr size_t kMin = 6;
  GenerationParams params = greedy(40);
  params.sampling.min_tokens = kMin;

  // Starts in token kMin - 1, ends in token kMin + 1: matched, cut where it starts.
  const std::string spanning = full.substr(kMin - 2, 3);
  params.stop_strings = {spanning};
  auto choices = assemble(collector_.wait(submit(p, params)));
  EXPECT_EQ(choices[0].finish, FinishReason::kStop) << full;
  EXPECT_EQ(choices[0].text, full.substr(0, kMin - 2)) << full;
  EXPECT_EQ(choices[0].tokens.size(), kMin + 1) << full;

  // Wholly inside token kMin: not a stop there; the first one ending after it is.
  const std::string inside = full.substr(kMin - 1, 1);
  params.stop_strings = {inside};
  const size_t later = full.find(inside, kMin);
  choices = assemble(collector_.wait(submit(p, params)));
  if (later == std::string::npos) {
    EXPECT_EQ(choices[0].finish, FinishReason::kLength) << full;
    EXPECT_EQ(choices[0].text, full) << full;
  } else {
    EXPECT_EQ(choices[0].finish, FinishReason::kStop) << full;
    EXPECT_EQ(choices[0].text, full.substr(0, later)) << full;
    EXPECT_EQ(choices[0].tokens.size(), later + 1) << full;
  }
  EXPECT_TRUE(wait_idle_blocks());
}

TEST_F(EngineTest, StopTokenIdsAndEosAndIgnoreEos) {
  std::vector<TokenId> p = prompt("ghij");
  std::vector<TokenId> ref = reference_generate(p, 30, alphabet_, std::nullopt);
  const TokenId eos = ref[5];
  const size_t first_eos = std::find(ref.begin(), ref.end(), eos) - ref.begin();
  start(256, 8, 1000, eos);

  auto choices = assemble(collector_.wait(submit(p, greedy(30))));
  EXPECT_EQ(choices[0].tokens, std::vector<TokenId>(ref.begin(), ref.begin() + first_eos + 1));
  EXPECT_EQ(choices[0].finish, FinishReason::kStop);
  EXPECT_EQ(choices[0].stop_token, std::nullopt);  // vLLM's stop_reason is null for EOS

  GenerationParams ignore = greedy(30);
  ignore.ignore_eos = true;
  choices = assemble(collector_.wait(submit(p, ignore)));
  EXPECT_EQ(choices[0].tokens, ref);
  EXPECT_EQ(choices[0].finish, FinishReason::kLength);

  GenerationParams stop_ids = greedy(30);
  stop_ids.ignore_eos = true;
  stop_ids.stop_token_ids = {ref[2]};
  const size_t first_stop = std::find(ref.begin(), ref.end(), ref[2]) - ref.begin();
  choices = assemble(collector_.wait(submit(p, stop_ids)));
  EXPECT_EQ(choices[0].tokens, std::vector<TokenId>(ref.begin(), ref.begin() + first_stop + 1));
  EXPECT_EQ(choices[0].stop_token, ref[2]);
  // The stop token's text is left out, as a stop string's is (vLLM), unless asked for.
  EXPECT_EQ(choices[0].text, decode(std::vector<TokenId>(ref.begin(), ref.begin() + first_stop)));
  stop_ids.include_stop_str_in_output = true;
  choices = assemble(collector_.wait(submit(p, stop_ids)));
  EXPECT_EQ(choices[0].text,
            decode(std::vector<TokenId>(ref.begin(), ref.begin() + first_stop + 1)));
}

TEST_F(EngineTest, SeveralChoicesAndLogprobs) {
  start();
  std::vector<TokenId> p = prompt("abcabc");
  GenerationParams params = greedy(7);
  params.n = 3;
  params.sampling.want_logprobs = true;
  params.sampling.top_logprobs = 2;
  RequestId id = submit(p, params);
  auto outputs = collector_.wait(id);
  auto choices = assemble(outputs);
  ASSERT_EQ(choices.size(), 3u);
  std::vector<TokenId> ref = reference_generate(p, 7, alphabet_, std::nullopt);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(choices[i].tokens, ref) << i;
    ASSERT_EQ(choices[i].logprobs.size(), 7u);
    EXPECT_EQ(choices[i].logprobs[0].logprob, -0.25f);
    EXPECT_EQ(choices[i].logprobs[0].top_logprobs.size(), 2u);
    EXPECT_EQ(choices[i].num_finish_marks, 1);
  }
  EXPECT_EQ(outputs.back().usage.prompt_tokens, static_cast<int64_t>(p.size()));
  EXPECT_EQ(outputs.back().usage.completion_tokens, 21);
}

TEST_F(EngineTest, MoreRequestsThanSlotsAllComplete) {
  start(/*num_blocks=*/96, /*max_num_seqs=*/3);
  std::map<RequestId, std::vector<TokenId>> prompts;
  for (int i = 0; i < 40; ++i) {
    std::vector<TokenId> p = prompt("shared prefix " + std::to_string(i % 7) + " x");
    prompts[submit(p, greedy(5 + i % 9))] = p;
  }
  int i = 0;
  for (const auto& [id, p] : prompts) {
    auto choices = assemble(collector_.wait(id));
    EXPECT_EQ(choices[0].tokens, reference_generate(p, 5 + i % 9, alphabet_, std::nullopt)) << id;
    ++i;
  }
  EXPECT_TRUE(wait_idle_blocks());
  EXPECT_GT(engine_->metrics().scheduler.pool.prefix_hit_tokens, 0);
}

TEST_F(EngineTest, AbortFreesBlocksAndEndsTheRequest) {
  start();
  // Hold the executor so the abort arrives while the request is mid-step, however fast the
  // fake executor would otherwise finish all 400 tokens.
  executor_->hold(true);
  RequestId id = submit(prompt("a long one"), greedy(400));
  engine_->abort(id);
  executor_->hold(false);
  auto outputs = collector_.wait(id);
  ASSERT_FALSE(outputs.empty());
  auto choices = assemble(outputs);
  EXPECT_EQ(choices[0].finish, FinishReason::kAbort);
  EXPECT_LT(choices[0].tokens.size(), 400u);
  EXPECT_TRUE(wait_idle_blocks());
  engine_->abort(id);    // already finished: ignored
  engine_->abort(9999);  // unknown: ignored
}

TEST_F(EngineTest, RejectsRequestsUpFront) {
  start(/*num_blocks=*/16);
  // Longer than the context (512).
  auto r = engine_->submit({std::vector<TokenId>(600, alphabet_[0]), greedy(4)}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  // Fits the context but not the KV cache (16 blocks of 4 = 64 tokens).
  r = engine_->submit({std::vector<TokenId>(60, alphabet_[0]), greedy(10)}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  r = engine_->submit({{}, greedy(4)}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = engine_->submit({{tokenizer_->vocab_size() + 5}, greedy(4)}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  GenerationParams bad = greedy(4);
  bad.n = 0;
  EXPECT_EQ(engine_->submit({{alphabet_[0]}, bad}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.stop_strings = {""};
  EXPECT_EQ(engine_->submit({{alphabet_[0]}, bad}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.sampling.logit_bias = {{static_cast<TokenId>(tokenizer_->vocab_size()), 1.0f}};
  EXPECT_EQ(engine_->submit({{alphabet_[0]}, bad}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  // Without max_tokens the default fills the KV cache / context.
  GenerationParams unbounded;
  unbounded.sampling.temperature = 0;
  auto ok = engine_->submit({std::vector<TokenId>(60, alphabet_[0]), unbounded}, collector_.sink());
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  auto choices = assemble(collector_.wait(*ok));
  EXPECT_EQ(choices[0].tokens.size(), 4u);
  EXPECT_EQ(choices[0].finish, FinishReason::kLength);
}

TEST_F(EngineTest, QueueLimitAndStopped) {
  start(256, 2, /*max_waiting=*/3);
  executor_->hold(true);  // the engine thread stalls inside its first step
  std::vector<RequestId> ids;
  int rejected = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = engine_->submit({prompt("q"), greedy(3)}, collector_.sink());
    if (r.ok()) {
      ids.push_back(*r);
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  // More choices than the queue ever holds: refused as invalid (not a 429 to retry).
  GenerationParams four = greedy(3);
  four.n = 4;
  EXPECT_EQ(engine_->waiting_capacity(), 3);
  const Status too_many = engine_->submit({prompt("q"), four}, collector_.sink()).status();
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument) << too_many.to_string();
  EXPECT_EQ(too_many.message().rfind("n = 4, more than the 3 sequences", 0), 0u)
      << too_many.message();
  executor_->hold(false);
  for (RequestId id : ids) EXPECT_FALSE(collector_.wait(id).empty());
  engine_->stop();
  EXPECT_EQ(engine_->submit({prompt("q"), greedy(3)}, nullptr).status().code(),
            StatusCode::kUnavailable);
}

// Requests submitted while the engine is inside a step see the sequences it admitted before
// that step as queued: a request the queue has room for is accepted, the others refused at
// once, and none accepted is refused later. (The arrivals counted as nothing until the step
// ended, so the surplus was accepted, then ended with "the waiting queue is full": a stream
// answered 200 and an error event instead of a 429.)
TEST_F(EngineTest, AcceptedRequestsAreNeverRefusedByAFullQueueLater) {
  start(256, 2, /*max_waiting=*/3);
  executor_->hold(true);
  // One request of three sequences (arriving together): the engine admits them, runs two and
  // holds inside the step; one stays queued.
  GenerationParams three = greedy(3);
  three.n = 3;
  std::vector<RequestId> ids = {submit(prompt("first"), three)};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!executor_->holding() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(executor_->holding());
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    auto r = engine_->submit({prompt("second"), greedy(3)}, collector_.sink());
    if (r.ok()) {
      ids.push_back(*r);
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
      ++refused;
    }
  }
  EXPECT_EQ(refused, 2);  // room for two: the queue holds three, one of the first is there
  executor_->hold(false);
  for (RequestId id : ids) {
    const auto outputs = collector_.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_TRUE(outputs.back().error.ok())
        << "request " << id << ": " << outputs.back().error.to_string();
  }
}

TEST_F(EngineTest, ExecutorFailureFailsTheStepsRequestsAndTheEngineGoesOn) {
  start();
  executor_->hold(true);
  RequestId a = submit(prompt("first"), greedy(5));
  executor_->fail_next(1);
  executor_->hold(false);
  auto outputs = collector_.wait(a);
  ASSERT_FALSE(outputs.empty());
  EXPECT_FALSE(outputs.back().error.ok());
  EXPECT_EQ(assemble(outputs)[0].finish, FinishReason::kError);
  EXPECT_TRUE(wait_idle_blocks());
  RequestId b = submit(prompt("second"), greedy(5));
  auto ok = collector_.wait(b);
  ASSERT_FALSE(ok.empty());
  EXPECT_TRUE(ok.back().error.ok());
  EXPECT_EQ(assemble(ok)[0].tokens.size(), 5u);
}

TEST_F(EngineTest, AGroupThatCannotStepOnEndsRequestsAsUnavailable) {
  // The group's agreement fails with the client-looking error a failed expert swap gives
  // (InvalidArgument for a NaN weight): the live request ends Unavailable, not with that code
  // (which the server turned into a 400 on this rank's requests), and new ones are refused.
  std::atomic<int> steps{0};
  lockstep_ = [&steps](int64_t rows) -> Result<bool> {
    if (rows > 0 && ++steps > 2) return invalid_argument("expert swap: a weight is not finite");
    return true;
  };
  start();
  GenerationParams long_run = greedy(50);
  long_run.ignore_eos = true;
  RequestId a = submit(prompt("first"), long_run);
  auto outputs = collector_.wait(a);
  ASSERT_FALSE(outputs.empty());
  EXPECT_EQ(assemble(outputs)[0].finish, FinishReason::kError);
  EXPECT_EQ(outputs.back().error.code(), StatusCode::kUnavailable)
      << outputs.back().error.to_string();
  EXPECT_NE(outputs.back().error.message().find("a weight is not finite"), std::string::npos)
      << outputs.back().error.to_string();
  EXPECT_EQ(engine_->submit({prompt("second"), greedy(2)}, collector_.sink()).status().code(),
            StatusCode::kUnavailable);
}

TEST_F(EngineTest, StopAbortsUnfinishedRequests) {
  start();
  executor_->hold(true);
  RequestId id = submit(prompt("never done"), greedy(100));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    executor_->hold(false);
  });
  engine_->stop();
  releaser.join();
  auto outputs = collector_.wait(id);
  ASSERT_FALSE(outputs.empty());
  EXPECT_EQ(assemble(outputs)[0].finish, FinishReason::kAbort);
}

}  // namespace
}  // namespace peerserve
