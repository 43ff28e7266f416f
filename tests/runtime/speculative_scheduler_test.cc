// The scheduler with speculative decoding, against the fake model (fake_executor.h), whose
// "KV" slots hold token ids: drafts are written into the cache like real KV, so a rejected
// draft that were kept (rollback missing), a draft slot published to the prefix cache or a
// block table too short for the drafts all change the output compared with
// reference_generate(), which knows nothing of drafts or paging.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/scheduler.h"
#include "tests/runtime/fake_executor.h"

namespace peerserve {
namespace {

using testing::FakeExecutor;
using testing::reference_generate;

constexpr TokenId kEos = 7;

struct Outcome {
  std::map<SequenceId, std::vector<TokenId>> tokens;
  int64_t steps = 0;
  int64_t drafts = 0;
  int64_t accepted = 0;
  int64_t eos_inside_runs = 0;  // updates of several tokens ending with EOS
  int64_t preemptions = 0;
};

SchedulerOptions options(int32_t k, int32_t num_blocks, int32_t budget) {
  SchedulerOptions o;
  o.max_num_seqs = 6;
  o.max_num_batched_tokens = budget;
  o.max_model_len = 200;
  o.block_pool = {.num_blocks = num_blocks, .block_size = 4, .enable_prefix_caching = true};
  o.num_speculative_tokens = k;
  return o;
}

SequenceSpec spec(SequenceId id, std::vector<TokenId> prompt, int32_t max_tokens) {
  SequenceSpec s;
  s.id = id;
  s.prompt_tokens = std::move(prompt);
  s.max_tokens = max_tokens;
  s.sampling.temperature = 0;
  s.eos_token_ids = {kEos};
  return s;
}

Outcome run(Scheduler& scheduler, FakeExecutor& executor) {
  Outcome out;
  for (int guard = 0; scheduler.has_work() && guard < 100000; ++guard) {
    StepPlan plan = scheduler.schedule();
    EXPECT_FALSE(plan.empty());
    if (plan.empty()) break;
    EXPECT_LE(plan.num_batched_tokens, scheduler.options().max_num_batched_tokens);
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_LE(static_cast<int32_t>(c.drafts.size()), scheduler.options().num_speculative_tokens);
      EXPECT_LE(c.num_lookahead, scheduler.options().num_speculative_tokens);
    }
    auto result = executor.execute(plan);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) break;
    for (const SequenceUpdate& u : scheduler.update(plan, *result)) {
      for (size_t j = 0; j < u.tokens.size(); ++j) {
        out.tokens[u.seq_id].push_back(u.tokens[j].token);
        // Nothing follows the token that ended the sequence.
        if (u.tokens[j].token == kEos) {
          EXPECT_EQ(j + 1, u.tokens.size());
          EXPECT_TRUE(u.finish_reason.has_value());
        }
      }
      out.drafts += u.num_drafts;
      out.accepted += u.num_accepted_drafts;
      if (u.tokens.size() > 1 && u.tokens.back().token == kEos) ++out.eos_inside_runs;
    }
    ++out.steps;
  }
  out.preemptions = scheduler.stats().num_preemptions;
  EXPECT_EQ(scheduler.stats().num_used_blocks, 0) << "blocks leaked";
  return out;
}

struct Workload {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<int32_t> max_tokens;
};

Workload make_workload(uint32_t seed, int n, int32_t vocab) {
  std::mt19937 rng(seed);
  Workload w;
  for (int i = 0; i < n; ++i) {
    std::vector<TokenId> prompt(3 + rng() % 20);
    for (TokenId& t : prompt) t = static_cast<TokenId>(8 + rng() % (vocab - 8));
    w.prompts.push_back(prompt);
    w.max_tokens.push_back(static_cast<int32_t>(1 + rng() % 40));
  }
  return w;
}

Outcome run_workload(const Workload& w, int32_t k, int64_t error_every, int32_t num_blocks,
                     int32_t budget, int32_t vocab, Scheduler* reuse = nullptr,
                     FakeExecutor* reuse_executor = nullptr) {
  std::unique_ptr<Scheduler> owned;
  std::unique_ptr<FakeExecutor> owned_executor;
  if (reuse == nullptr) {
    auto s = Scheduler::create(options(k, num_blocks, budget));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    owned = std::move(s).value();
    owned_executor = std::make_unique<FakeExecutor>(num_blocks, 4, vocab);
    owned_executor->set_draft_error_every(error_every);
  }
  Scheduler& scheduler = reuse ? *reuse : *owned;
  FakeExecutor& executor = reuse_executor ? *reuse_executor : *owned_executor;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    EXPECT_TRUE(scheduler.add(spec(i + 1, w.prompts[i], w.max_tokens[i])).ok());
  }
  return run(scheduler, executor);
}

void expect_reference(const Workload& w, const Outcome& out, int32_t vocab,
                      const std::string& what) {
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    const auto it = out.tokens.find(i + 1);
    ASSERT_NE(it, out.tokens.end()) << what << ": sequence " << i + 1 << " produced nothing";
    EXPECT_EQ(it->second, reference_generate(w.prompts[i], w.max_tokens[i], vocab, kEos))
        << what << ": sequence " << i + 1;
  }
}

TEST(SpeculativeSchedulerTest, OutputEqualsNonSpeculativeDecoding) {
  constexpr int32_t kVocab = 64;
  const Workload w = make_workload(1, 24, kVocab);
  for (int32_t k : {1, 2, 3}) {
    for (int64_t error_every : {0, 2, 3}) {
      const std::string what =
          "K=" + std::to_string(k) + " error_every=" + std::to_string(error_every);
      const Outcome out = run_workload(w, k, error_every, 256, 64, kVocab);
      expect_reference(w, out, kVocab, what);
      EXPECT_GT(out.drafts, 0) << what;
      if (error_every == 0) {
        EXPECT_EQ(out.accepted, out.drafts) << what;
      }
      if (error_every == 2) {
        EXPECT_LT(out.accepted, out.drafts) << what;
      }
    }
  }
}

TEST(SpeculativeSchedulerTest, AcceptedDraftsSaveSteps) {
  constexpr int32_t kVocab = 64;
  Workload w;
  w.prompts = {{10, 11, 12, 13}};
  w.max_tokens = {40};
  // An EOS-free continuation: pick a prompt whose reference output has no EOS.
  for (TokenId first = 10; first < 60; ++first) {
    w.prompts[0][0] = first;
    const auto ref = reference_generate(w.prompts[0], 40, kVocab, kEos);
    if (ref.size() == 40) break;
  }
  const Outcome plain = run_workload(w, 0, 0, 64, 64, kVocab);
  const Outcome k1 = run_workload(w, 1, 0, 64, 64, kVocab);
  const Outcome k3 = run_workload(w, 3, 0, 64, 64, kVocab);
  expect_reference(w, plain, kVocab, "off");
  expect_reference(w, k1, kVocab, "K=1");
  expect_reference(w, k3, kVocab, "K=3");
  // Perfect drafts: prefill, one step without drafts, then K + 1 tokens per step.
  EXPECT_EQ(plain.steps, 40);
  EXPECT_EQ(k1.steps, 1 + (39 + 1) / 2);
  EXPECT_EQ(k3.steps, 1 + (39 + 3) / 4);
}

TEST(SpeculativeSchedulerTest, PreemptionAndTightBudgetsKeepTheOutput) {
  constexpr int32_t kVocab = 64;
  const Workload w = make_workload(2, 16, kVocab);
  // 18 blocks of 4 tokens for up to 6 running sequences of up to 62 tokens: preemption; a
  // budget of 12 tokens truncates drafts and splits prompts.
  const Outcome out = run_workload(w, 3, 3, 18, 12, kVocab);
  expect_reference(w, out, kVocab, "tight");
  EXPECT_GT(out.preemptions, 0);
  EXPECT_GT(out.accepted, 0);
}

TEST(SpeculativeSchedulerTest, EosAndStopInsideAnAcceptedRun) {
  // A vocabulary of 10 makes EOS (7) frequent, so it often lands inside a run of accepted
  // drafts; the tokens after it must be dropped.
  constexpr int32_t kVocab = 10;
  const Workload w = make_workload(3, 40, kVocab);
  const Outcome out = run_workload(w, 3, 0, 512, 64, kVocab);
  expect_reference(w, out, kVocab, "eos");
  EXPECT_GT(out.eos_inside_runs, 0);
}

TEST(SpeculativeSchedulerTest, PrefixCacheStaysRightAfterRejectedDrafts) {
  // The same prompts twice on one scheduler: the second round shares the blocks the first
  // published. A rejected draft's slot published as computed KV would change its output.
  constexpr int32_t kVocab = 64;
  const Workload w = make_workload(4, 12, kVocab);
  auto s = Scheduler::create(options(2, 256, 64));
  ASSERT_TRUE(s.ok());
  FakeExecutor executor(256, 4, kVocab);
  executor.set_draft_error_every(2);
  const Outcome first = run_workload(w, 2, 2, 256, 64, kVocab, s->get(), &executor);
  expect_reference(w, first, kVocab, "first round");
  Workload again = w;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    // Longer prompts: the first round's prompt and output, so whole generated blocks hit.
    again.prompts[i].insert(again.prompts[i].end(), first.tokens.at(i + 1).begin(),
                            first.tokens.at(i + 1).end());
    if (again.prompts[i].back() == kEos) again.prompts[i].back() = 9;
  }
  std::map<SequenceId, std::vector<TokenId>> second_tokens;
  for (size_t i = 0; i < again.prompts.size(); ++i) {
    ASSERT_TRUE((*s)->add(spec(100 + i, again.prompts[i], again.max_tokens[i])).ok());
  }
  const Outcome second = run(**s, executor);
  for (size_t i = 0; i < again.prompts.size(); ++i) {
    EXPECT_EQ(second.tokens.at(100 + i),
              reference_generate(again.prompts[i], again.max_tokens[i], kVocab, kEos))
        << "sequence " << i;
  }
  EXPECT_GT((*s)->stats().pool.prefix_hit_tokens, 0);
}

TEST(SpeculativeSchedulerTest, DraftsOnlyWhileTheBatchIsSmall) {
  constexpr int32_t kVocab = 64;
  SchedulerOptions o = options(1, 256, 64);
  o.speculative_max_running = 2;
  auto s = Scheduler::create(o);
  ASSERT_TRUE(s.ok());
  FakeExecutor executor(256, 4, kVocab);
  const Workload w = make_workload(5, 5, kVocab);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    ASSERT_TRUE((*s)->add(spec(i + 1, w.prompts[i], 30)).ok());
  }
  int64_t drafted_with_many = 0, drafted_with_few = 0;
  std::map<SequenceId, std::vector<TokenId>> tokens;
  while ((*s)->has_work()) {
    const int32_t running_before = (*s)->stats().num_running;
    StepPlan plan = (*s)->schedule();
    for (const ScheduledChunk& c : plan.chunks) {
      const bool drafts = !c.drafts.empty() || c.num_lookahead > 0;
      if (drafts && running_before > 2) ++drafted_with_many;
      if (drafts && running_before <= 2) ++drafted_with_few;
    }
    auto result = executor.execute(plan);
    ASSERT_TRUE(result.ok());
    for (const SequenceUpdate& u : (*s)->update(plan, *result)) {
      for (const SampledToken& t : u.tokens) tokens[u.seq_id].push_back(t.token);
    }
  }
  EXPECT_EQ(drafted_with_many, 0);
  EXPECT_GT(drafted_with_few, 0);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    EXPECT_EQ(tokens[i + 1], reference_generate(w.prompts[i], 30, kVocab, kEos));
  }
}

// Drafts get only the budget that every running sequence's known token and the admissions
// leave. Taken first, the two oldest sequences' drafts (1 + 3 tokens each) filled a budget of
// 8 for their whole lives: the other two were not admitted until they ended.
TEST(SpeculativeSchedulerTest, DraftsNeverCrowdOutOtherSequences) {
  constexpr int32_t kVocab = 64;
  auto s = Scheduler::create(options(3, 256, 8));
  ASSERT_TRUE(s.ok());
  FakeExecutor executor(256, 4, kVocab);  // drafts always right
  const Workload w = make_workload(9, 4, kVocab);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    SequenceSpec sequence = spec(i + 1, {w.prompts[i].begin(), w.prompts[i].begin() + 3}, 40);
    sequence.eos_token_ids.clear();  // all four run their 40 tokens
    ASSERT_TRUE((*s)->add(std::move(sequence)).ok());
  }
  int32_t most_running = 0;
  int64_t steps = 0, drafts = 0;
  std::map<SequenceId, std::vector<TokenId>> tokens;
  while ((*s)->has_work() && steps < 1000) {
    const int32_t running = (*s)->stats().num_running;
    most_running = std::max(most_running, running);
    StepPlan plan = (*s)->schedule();
    EXPECT_LE(plan.num_batched_tokens, 8);
    // Every running sequence moves in every step.
    EXPECT_GE(static_cast<int32_t>(plan.chunks.size()), running) << "step " << steps;
    for (const ScheduledChunk& c : plan.chunks) drafts += static_cast<int64_t>(c.drafts.size());
    auto result = executor.execute(plan);
    ASSERT_TRUE(result.ok());
    for (const SequenceUpdate& u : (*s)->update(plan, *result)) {
      for (const SampledToken& t : u.tokens) tokens[u.seq_id].push_back(t.token);
    }
    ++steps;
    if (steps == 3) {
      EXPECT_EQ((*s)->stats().num_waiting, 0) << "all four admitted early";
    }
  }
  EXPECT_EQ(most_running, 4);
  EXPECT_GT(drafts, 0);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    EXPECT_EQ(tokens[i + 1], reference_generate({w.prompts[i].begin(), w.prompts[i].begin() + 3},
                                                40, kVocab, std::nullopt));
  }
}

TEST(SpeculativeSchedulerTest, GuardTurnsUselessDraftsOff) {
  constexpr int32_t kVocab = 64;
  const Workload w = make_workload(6, 8, kVocab);
  for (const int64_t error_every : {1, 0}) {  // every draft wrong; every draft right
    SchedulerOptions o = options(1, 256, 64);
    o.speculative_guard_drafts = 20;
    o.speculative_min_acceptance = 0.5;
    auto s = Scheduler::create(o);
    ASSERT_TRUE(s.ok());
    FakeExecutor executor(256, 4, kVocab);
    executor.set_draft_error_every(error_every);
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      ASSERT_TRUE((*s)->add(spec(i + 1, w.prompts[i], w.max_tokens[i])).ok());
    }
    const Outcome out = run(**s, executor);
    expect_reference(w, out, kVocab, "guard");
    if (error_every == 1) {
      EXPECT_FALSE((*s)->speculation_enabled());
      EXPECT_EQ(out.accepted, 0);
      // Off right after the step that reached 20 verified drafts (8 sequences per step).
      EXPECT_LE(out.drafts, 20 + 8);
      EXPECT_FALSE((*s)->schedule().speculative);
    } else {
      EXPECT_TRUE((*s)->speculation_enabled());
      EXPECT_GT(out.drafts, 20);
    }
  }
}

TEST(SpeculativeSchedulerTest, RejectsBadOptions) {
  SchedulerOptions o = options(kMaxSpeculativeTokens + 1, 16, 16);
  EXPECT_EQ(Scheduler::create(o).status().code(), StatusCode::kInvalidArgument);
  o = options(1, 16, 16);
  o.speculative_max_running = -1;
  EXPECT_EQ(Scheduler::create(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace peerserve
