#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kv/prefix_hash.h"
#include "tests/runtime/fake_executor.h"

namespace peerserve {
namespace {

using testing::FakeExecutor;
using testing::reference_generate;

constexpr int32_t kVocab = 64;
constexpr TokenId kEos = 7;

SchedulerOptions small_options(int32_t num_blocks, int32_t block_size = 4) {
  SchedulerOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 32;
  o.max_model_len = 256;
  o.max_waiting_seqs = 1000;
  o.block_pool = {
      .num_blocks = num_blocks, .block_size = block_size, .enable_prefix_caching = true};
  return o;
}

std::unique_ptr<Scheduler> make(const SchedulerOptions& o) {
  auto s = Scheduler::create(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}

SequenceSpec spec(SequenceId id, std::vector<TokenId> prompt, int32_t max_tokens,
                  std::optional<TokenId> eos = kEos) {
  SequenceSpec s;
  s.id = id;
  s.prompt_tokens = std::move(prompt);
  s.max_tokens = max_tokens;
  s.sampling.temperature = 0;
  if (eos) s.eos_token_ids = {*eos};
  return s;
}

struct RunStats {
  int64_t steps = 0;
  int64_t max_running = 0;
  int64_t max_batched = 0;
  std::vector<SequenceId> finish_order;
};

// Runs the scheduler with the fake executor until idle; collects each sequence's tokens.
RunStats run_to_completion(Scheduler& scheduler, FakeExecutor& executor,
                           std::map<SequenceId, std::vector<TokenId>>* outputs,
                           std::map<SequenceId, FinishReason>* reasons = nullptr) {
  RunStats stats;
  for (int guard = 0; scheduler.has_work() && guard < 100000; ++guard) {
    StepPlan plan = scheduler.schedule();
    EXPECT_FALSE(plan.empty()) << "scheduler has work but planned nothing";
    if (plan.empty()) break;
    EXPECT_LE(plan.num_batched_tokens, scheduler.options().max_num_batched_tokens);
    stats.max_batched = std::max(stats.max_batched, plan.num_batched_tokens);
    stats.max_running = std::max<int64_t>(stats.max_running, scheduler.stats().num_running);
    auto result = executor.execute(plan);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) break;
    for (const SequenceUpdate& u : scheduler.update(plan, *result)) {
      for (const SampledToken& t : u.tokens) (*outputs)[u.seq_id].push_back(t.token);
      if (u.finish_reason) {
        stats.finish_order.push_back(u.seq_id);
        if (reasons) (*reasons)[u.seq_id] = *u.finish_reason;
      }
    }
    ++stats.steps;
  }
  return stats;
}

// One schedule / execute / update round, its tokens added to `outputs`; the plan it ran.
StepPlan step_once(Scheduler& scheduler, FakeExecutor& executor,
                   std::map<SequenceId, std::vector<TokenId>>* outputs) {
  StepPlan plan = scheduler.schedule();
  auto result = executor.execute(plan);
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  if (!result.ok()) {
    scheduler.abandon(plan);
    return plan;
  }
  for (const SequenceUpdate& u : scheduler.update(plan, *result)) {
    for (const SampledToken& t : u.tokens) (*outputs)[u.seq_id].push_back(t.token);
  }
  return plan;
}

std::vector<TokenId> random_tokens(std::mt19937& rng, int n) {
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(8 + rng() % (kVocab - 8));  // avoid EOS
  return t;
}

TEST(SchedulerTest, RejectsSequencesThatCanNeverFit) {
  auto s = make(small_options(/*num_blocks=*/8));  // 32 tokens of KV
  Status too_long = s->add(spec(1, std::vector<TokenId>(300, 9), 4));
  EXPECT_EQ(too_long.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.message().find("context length is 256"), std::string::npos)
      << too_long.message();
  Status too_big = s->add(spec(2, std::vector<TokenId>(30, 9), 10));
  EXPECT_EQ(too_big.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_big.message().find("KV blocks"), std::string::npos) << too_big.message();
  EXPECT_EQ(s->add(spec(3, {}, 4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->add(spec(4, {1}, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->add(spec(5, std::vector<TokenId>(20, 9), 12)).ok());
  EXPECT_EQ(s->add(spec(5, {1}, 1)).code(), StatusCode::kInvalidArgument);  // duplicate id
  EXPECT_EQ(max_tokens_limit(s->options(), 20), 12);
}

TEST(SchedulerTest, WaitingQueueLimit) {
  SchedulerOptions o = small_options(64);
  o.max_waiting_seqs = 2;
  auto s = make(o);
  EXPECT_TRUE(s->add(spec(1, {9, 9}, 2)).ok());
  EXPECT_TRUE(s->add(spec(2, {9, 9}, 2)).ok());
  EXPECT_EQ(s->add(spec(3, {9, 9}, 2)).code(), StatusCode::kResourceExhausted);
}

TEST(SchedulerTest, SingleSequenceMatchesReference) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::vector<TokenId> prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  ASSERT_TRUE(s->add(spec(1, prompt, 20)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(out[1], reference_generate(prompt, 20, kVocab, kEos));
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

TEST(SchedulerTest, ChunkedPrefillRespectsTheBudgetAndMixesDecodes) {
  SchedulerOptions o = small_options(128);
  o.max_num_batched_tokens = 16;
  auto s = make(o);
  FakeExecutor ex(128, 4, kVocab);
  std::mt19937 rng(5);
  ASSERT_TRUE(s->add(spec(1, random_tokens(rng, 5), 30, std::nullopt)).ok());
  // First step: sequence 1's whole prompt.
  StepPlan p1 = s->schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);
  EXPECT_EQ(p1.chunks[0].tokens.size(), 5u);
  EXPECT_TRUE(p1.chunks[0].sample);
  auto r1 = ex.execute(p1);
  ASSERT_TRUE(r1.ok());
  s->update(p1, *r1);
  // A 40-token prompt arrives: it is prefilled in chunks of at most 15 next to the decode.
  std::vector<TokenId> long_prompt = random_tokens(rng, 40);
  ASSERT_TRUE(s->add(spec(2, long_prompt, 3, std::nullopt)).ok());
  int prefill_steps = 0;
  int64_t prefilled = 0;
  while (prefilled < 40) {
    StepPlan p = s->schedule();
    ASSERT_EQ(p.chunks.size(), 2u);
    EXPECT_EQ(p.chunks[0].seq_id, 1u);  // the older decode goes first
    EXPECT_EQ(p.chunks[0].tokens.size(), 1u);
    EXPECT_EQ(p.chunks[1].seq_id, 2u);
    EXPECT_EQ(p.chunks[1].start_pos, prefilled);
    EXPECT_LE(p.num_batched_tokens, 16);
    prefilled += static_cast<int64_t>(p.chunks[1].tokens.size());
    EXPECT_EQ(p.chunks[1].sample, prefilled == 40);
    auto r = ex.execute(p);
    ASSERT_TRUE(r.ok());
    s->update(p, *r);
    ++prefill_steps;
  }
  EXPECT_EQ(prefill_steps, 3);  // 15 + 15 + 10
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

TEST(SchedulerTest, PrefillChunkCapAppliesOnlyBesideOtherSequences) {
  SchedulerOptions o = small_options(128);
  o.max_prefill_chunk_tokens = 4;
  auto s = make(o);
  FakeExecutor ex(128, 4, kVocab);
  std::mt19937 rng(9);
  // Alone, a prompt is not capped: all 10 tokens in one step.
  const std::vector<TokenId> first = random_tokens(rng, 10);
  ASSERT_TRUE(s->add(spec(1, first, 30, std::nullopt)).ok());
  StepPlan p1 = s->schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);
  EXPECT_EQ(p1.chunks[0].tokens.size(), 10u);
  auto r1 = ex.execute(p1);
  ASSERT_TRUE(r1.ok());
  s->update(p1, *r1);
  // Beside a running decode, an 11-token prompt goes in chunks of 4, 4, 3.
  const std::vector<TokenId> second = random_tokens(rng, 11);
  ASSERT_TRUE(s->add(spec(2, second, 3, std::nullopt)).ok());
  std::vector<size_t> chunks;
  std::map<SequenceId, std::vector<TokenId>> out;
  while (chunks.empty() || chunks.back() == 4) {
    StepPlan p = s->schedule();
    ASSERT_EQ(p.chunks.size(), 2u);
    EXPECT_EQ(p.chunks[0].tokens.size(), 1u);  // the decode is never held back
    chunks.push_back(p.chunks[1].tokens.size());
    auto r = ex.execute(p);
    ASSERT_TRUE(r.ok());
    for (const SequenceUpdate& u : s->update(p, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
    }
  }
  EXPECT_EQ(chunks, (std::vector<size_t>{4, 4, 3}));
  // The outputs are those of a scheduler without the cap (chunking changes no token).
  run_to_completion(*s, ex, &out);
  SchedulerOptions plain_options = small_options(128);
  auto plain = make(plain_options);
  FakeExecutor plain_ex(128, 4, kVocab);
  ASSERT_TRUE(plain->add(spec(1, first, 30, std::nullopt)).ok());
  ASSERT_TRUE(plain->add(spec(2, second, 3, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> plain_out;
  run_to_completion(*plain, plain_ex, &plain_out);
  EXPECT_EQ(out[2], plain_out[2]);
  SchedulerOptions bad = small_options(128);
  bad.max_prefill_chunk_tokens = -1;
  EXPECT_FALSE(Scheduler::create(bad).ok());
}

TEST(SchedulerTest, FirstComeFirstServedWithOneSlot) {
  SchedulerOptions o = small_options(64);
  o.max_num_seqs = 1;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(9);
  for (SequenceId id = 1; id <= 5; ++id) {
    ASSERT_TRUE(
        s->add(spec(id, random_tokens(rng, 3 + static_cast<int>(id)), 4, std::nullopt)).ok());
  }
  std::map<SequenceId, std::vector<TokenId>> out;
  RunStats stats = run_to_completion(*s, ex, &out);
  EXPECT_EQ(stats.finish_order, (std::vector<SequenceId>{1, 2, 3, 4, 5}));
  EXPECT_EQ(stats.max_running, 1);
}

TEST(SchedulerTest, LongHeadOfQueueIsNotOvertaken) {
  // A waiting prompt that does not fit yet blocks later (smaller) ones: no starvation.
  SchedulerOptions o = small_options(/*num_blocks=*/10);
  auto s = make(o);
  FakeExecutor ex(10, 4, kVocab);
  std::mt19937 rng(3);
  ASSERT_TRUE(s->add(spec(1, random_tokens(rng, 20), 8, std::nullopt)).ok());  // 7 blocks
  StepPlan p = s->schedule();
  auto r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  s->update(p, *r);
  // Sequence 1 now holds 6 blocks; sequence 2's first chunk needs 5 of the 4 left.
  ASSERT_TRUE(s->add(spec(2, random_tokens(rng, 20), 4, std::nullopt)).ok());
  ASSERT_TRUE(s->add(spec(3, random_tokens(rng, 2), 2, std::nullopt)).ok());  // 1 block
  StepPlan p2 = s->schedule();
  // Sequence 2 does not fit next to 1, and 3 must not jump ahead of it.
  ASSERT_EQ(p2.chunks.size(), 1u);
  EXPECT_EQ(p2.chunks[0].seq_id, 1u);
  r = ex.execute(p2);
  ASSERT_TRUE(r.ok());
  s->update(p2, *r);
  std::map<SequenceId, std::vector<TokenId>> out;
  RunStats stats = run_to_completion(*s, ex, &out);
  ASSERT_EQ(stats.finish_order.size(), 3u);
  EXPECT_EQ(stats.finish_order[0], 1u);
}

TEST(SchedulerTest, PreemptsTheNewestAndRecomputesToTheSameTokens) {
  // 12 blocks of 4 tokens; four sequences that each grow to 10 blocks at most.
  SchedulerOptions o = small_options(12);
  o.block_pool.enable_prefix_caching = false;  // recompute from scratch
  auto s = make(o);
  FakeExecutor ex(12, 4, kVocab);
  std::mt19937 rng(11);
  std::map<SequenceId, std::vector<TokenId>> prompts;
  for (SequenceId id = 1; id <= 4; ++id) {
    prompts[id] = random_tokens(rng, 6);
    ASSERT_TRUE(s->add(spec(id, prompts[id], 30, std::nullopt)).ok());
  }
  std::map<SequenceId, std::vector<TokenId>> out;
  RunStats stats = run_to_completion(*s, ex, &out);
  EXPECT_GT(s->stats().num_preemptions, 0);
  for (SequenceId id = 1; id <= 4; ++id) {
    EXPECT_EQ(out[id], reference_generate(prompts[id], 30, kVocab, std::nullopt)) << id;
  }
  // The oldest is never preempted, so it finishes first.
  EXPECT_EQ(stats.finish_order[0], 1u);
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

TEST(SchedulerTest, PrefixCacheHitSharesBlocksAndGivesTheSameTokens) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(21);
  std::vector<TokenId> prefix = random_tokens(rng, 13);
  std::vector<TokenId> a = prefix, b = prefix;
  a.push_back(30);
  b.push_back(31);
  ASSERT_TRUE(s->add(spec(1, a, 6, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  const int64_t hits_before = s->stats().pool.prefix_hit_tokens;
  ASSERT_TRUE(s->add(spec(2, b, 6, std::nullopt)).ok());
  StepPlan p = s->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  // 13 shared tokens = 3 full blocks of 4: only the last 2 prompt tokens are computed.
  EXPECT_EQ(p.chunks[0].start_pos, 12);
  EXPECT_EQ(p.chunks[0].tokens.size(), 2u);
  auto r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  for (const auto& u : s->update(p, *r)) {
    for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
    EXPECT_EQ(u.num_cached_prompt_tokens, 12);
  }
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(s->stats().pool.prefix_hit_tokens - hits_before, 12);
  EXPECT_EQ(out[1], reference_generate(a, 6, kVocab, std::nullopt));
  EXPECT_EQ(out[2], reference_generate(b, 6, kVocab, std::nullopt));
}

// The choices of one request (SequenceSpec::prompt_from) compute the prompt once: the others
// wait for choice 0's shareable blocks and find them in the prefix cache (they each
// computed and held the whole prompt when admitted in the same step).
TEST(SchedulerTest, ChoicesOfOneRequestComputeThePromptOnce) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(23);
  const std::vector<TokenId> prompt = random_tokens(rng, 25);  // 6 shareable blocks of 4
  for (SequenceId id = 1; id <= 3; ++id) {
    SequenceSpec sp = spec(id, prompt, 3, std::nullopt);
    sp.seed = id;
    if (id > 1) sp.prompt_from = 1;
    ASSERT_TRUE(s->add(std::move(sp)).ok());
  }
  std::map<SequenceId, std::vector<TokenId>> out;
  std::map<SequenceId, int64_t> cached;
  int64_t prompt_tokens_computed = 0;
  for (int guard = 0; s->has_work() && guard < 1000; ++guard) {
    StepPlan p = s->schedule();
    ASSERT_FALSE(p.empty());
    for (const ScheduledChunk& c : p.chunks) {
      if (c.start_pos < static_cast<int64_t>(prompt.size())) {
        prompt_tokens_computed +=
            std::min<int64_t>(static_cast<int64_t>(c.tokens.size()),
                              static_cast<int64_t>(prompt.size()) - c.start_pos);
      }
    }
    auto r = ex.execute(p);
    ASSERT_TRUE(r.ok());
    for (const auto& u : s->update(p, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
      if (!cached.count(u.seq_id)) cached[u.seq_id] = u.num_cached_prompt_tokens;
    }
  }
  // 25 tokens once, then 1 (the last prompt token) for each other choice.
  EXPECT_EQ(prompt_tokens_computed, 25 + 1 + 1);
  EXPECT_EQ(cached[1], 0);
  EXPECT_EQ(cached[2], 24);
  EXPECT_EQ(cached[3], 24);
  for (SequenceId id = 1; id <= 3; ++id) {
    EXPECT_EQ(out[id], reference_generate(prompt, 3, kVocab, std::nullopt)) << id;
  }
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

// A sequence with a cache salt shares blocks only with sequences of the same salt.
TEST(SchedulerTest, ACacheSaltSharesBlocksOnlyWithTheSameSalt) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(22);
  const std::vector<TokenId> prompt = random_tokens(rng, 13);
  std::map<SequenceId, std::vector<TokenId>> out;
  auto cached_tokens_of = [&](SequenceId id, const std::string& salt) {
    SequenceSpec sp = spec(id, prompt, 2, std::nullopt);
    sp.cache_salt = salt;
    EXPECT_TRUE(s->add(std::move(sp)).ok());
    StepPlan p = s->schedule();
    EXPECT_EQ(p.chunks.size(), 1u);
    auto r = ex.execute(p);
    EXPECT_TRUE(r.ok());
    int64_t cached = -1;
    for (const auto& u : s->update(p, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
      cached = u.num_cached_prompt_tokens;
    }
    run_to_completion(*s, ex, &out);
    EXPECT_EQ(out[id], reference_generate(prompt, 2, kVocab, std::nullopt)) << id;
    return cached;
  };
  EXPECT_EQ(cached_tokens_of(1, "a"), 0);
  EXPECT_EQ(cached_tokens_of(2, "b"), 0);
  EXPECT_EQ(cached_tokens_of(3, ""), 0);
  EXPECT_EQ(cached_tokens_of(4, "a"), 12);
  EXPECT_EQ(cached_tokens_of(5, ""), 12);
}

// With speculative decoding the MTP layer's KV at a block's last position is computed from
// the token after the block, so a block is shared only when that token matches too.
TEST(SchedulerTest, WithMtpKvABlockIsSharedOnlyWhenTheTokenAfterItMatches) {
  SchedulerOptions o = small_options(64);
  o.num_speculative_tokens = 1;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(23);
  const std::vector<TokenId> prefix = random_tokens(rng, 12);  // 3 full blocks of 4
  std::vector<TokenId> a = prefix, b = prefix, c = prefix;
  a.insert(a.end(), {30, 40});
  b.insert(b.end(), {31, 40});  // differs in the token after the third block
  c.insert(c.end(), {30, 41});  // the same token after it
  ASSERT_TRUE(s->add(spec(1, a, 6, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  auto first_chunk_start = [&](SequenceId id, const std::vector<TokenId>& prompt) {
    EXPECT_TRUE(s->add(spec(id, prompt, 6, std::nullopt)).ok());
    const StepPlan p = step_once(*s, ex, &out);
    EXPECT_EQ(p.chunks.size(), 1u);
    run_to_completion(*s, ex, &out);
    return p.chunks.empty() ? -1 : p.chunks[0].start_pos;
  };
  EXPECT_EQ(first_chunk_start(2, b), 8);   // blocks 0 and 1 only
  EXPECT_EQ(first_chunk_start(3, c), 12);  // all three
  EXPECT_EQ(out[2], reference_generate(b, 6, kVocab, std::nullopt));
  EXPECT_EQ(out[3], reference_generate(c, 6, kVocab, std::nullopt));

  // Without speculation the same prompts share all three blocks (no MTP KV to match).
  auto plain = make(small_options(64));
  FakeExecutor plain_ex(64, 4, kVocab);
  ASSERT_TRUE(plain->add(spec(1, a, 6, std::nullopt)).ok());
  run_to_completion(*plain, plain_ex, &out);
  ASSERT_TRUE(plain->add(spec(2, b, 6, std::nullopt)).ok());
  const StepPlan p = plain->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start_pos, 12);
  plain->abandon(p);
}

// Once speculation is off for good, blocks computed from then on (no MTP KV) are hashed
// without lookahead: they are never handed to a lookup that expects MTP KV.
TEST(SchedulerTest, BlocksComputedAfterSpeculationStoppedAreHashedWithoutLookahead) {
  SchedulerOptions o = small_options(64);
  o.num_speculative_tokens = 1;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(29);
  const std::vector<TokenId> prompt = random_tokens(rng, 14);
  ASSERT_TRUE(s->add(spec(1, prompt, 10, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  // The prompt in one step: blocks 0-2 get their MTP KV and are published with lookahead.
  const StepPlan p = step_once(*s, ex, &out);
  ASSERT_EQ(p.chunks.size(), 1u);
  ASSERT_EQ(p.chunks[0].tokens.size(), prompt.size());
  EXPECT_EQ(s->block_hash_lookahead(), 1);
  s->disable_speculation();
  EXPECT_EQ(s->block_hash_lookahead(), 0);
  run_to_completion(*s, ex, &out);
  std::vector<TokenId> tokens = prompt;
  tokens.insert(tokens.end(), out[1].begin(), out[1].end());
  ASSERT_EQ(tokens.size(), 24u);  // 23 computed: blocks 0-4 full
  std::vector<BlockHash> mixed, ahead, plain;
  extend_block_hash_chain(std::span(tokens).first(13), 4, o.prefix_root, &mixed, 1);
  ASSERT_EQ(mixed.size(), 3u);
  extend_block_hash_chain(tokens, 4, o.prefix_root, &mixed);
  extend_block_hash_chain(tokens, 4, o.prefix_root, &ahead, 1);
  extend_block_hash_chain(tokens, 4, o.prefix_root, &plain);
  EXPECT_EQ(s->cached_prefix_blocks(mixed), 5);
  EXPECT_EQ(s->cached_prefix_blocks(ahead), 3);  // blocks 3-4 have no MTP KV
  EXPECT_EQ(s->cached_prefix_blocks(plain), 0);
}

// A prefill instance's pushed partial block (SequenceSpec::prefilled_tail_block): used only
// at the first admission right after all the prompt's full blocks, otherwise released;
// never leaked.
TEST(SchedulerTest, PrefilledTailBlockIsUsedOnlyAfterAllItsFullBlocks) {
  auto s = make(small_options(32));
  FakeExecutor ex(32, 4, kVocab);
  std::mt19937 rng(5);
  const std::vector<TokenId> prompt = random_tokens(rng, 10);  // 2 full blocks + 1 token
  const auto want = reference_generate(prompt, 5, kVocab, std::nullopt);
  auto tail_block = [&](bool right) {
    // A reserved block holding the prompt's 9th token (wrong KV when !right).
    const Scheduler::Reservation r = s->reserve_blocks({}, 1);
    EXPECT_EQ(r.fresh.size(), 1u);
    std::vector<int32_t> slots(4, -1);
    slots[0] = right ? prompt[8] : (prompt[8] + 1) % kVocab;
    EXPECT_TRUE(ex.write_kv_block(r.fresh[0], std::as_bytes(std::span<const int32_t>(slots))).ok());
    return r.fresh[0];
  };
  auto with_tail = [&](SequenceId id, BlockId block, int32_t tokens = 1) {
    SequenceSpec sp = spec(id, prompt, 5, std::nullopt);
    sp.prefilled_tail_block = block;
    sp.prefilled_tail_tokens = tokens;
    return sp;
  };
  std::map<SequenceId, std::vector<TokenId>> out;
  // Nothing cached before it: the block is released and the whole prompt computed.
  ASSERT_TRUE(s->add(with_tail(1, tail_block(false))).ok());
  StepPlan p = s->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start_pos, 0);
  auto r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  for (const auto& u : s->update(p, *r)) {
    for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
  }
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(out[1], want);
  EXPECT_EQ(s->stats().num_used_blocks, 0);
  // Both full blocks cached now: the tail is taken and only the last token is computed.
  ASSERT_TRUE(s->add(with_tail(2, tail_block(true))).ok());
  p = s->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start_pos, 9);
  EXPECT_EQ(p.chunks[0].tokens.size(), 1u);
  r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  for (const auto& u : s->update(p, *r)) {
    for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
    EXPECT_EQ(u.num_cached_prompt_tokens, 9);
  }
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(out[2], want);  // the fake's KV is the tokens: a wrong tail would show here
  EXPECT_EQ(s->stats().num_used_blocks, 0);
  // A tail whose token count does not fit the prompt is released at add(); one finished while
  // waiting, at finish().
  ASSERT_TRUE(s->add(with_tail(3, tail_block(true), 2)).ok());
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(out[3], want);
  ASSERT_TRUE(s->add(with_tail(4, tail_block(true))).ok());
  EXPECT_EQ(s->stats().num_used_blocks, 1);
  s->finish(4, FinishReason::kAbort);
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

// Pushed partial blocks held by waiting sequences give way when the oldest sequence needs
// the memory: otherwise the scheduler planned nothing while it had work (the engine aborted).
TEST(SchedulerTest, PrefilledTailsOfWaitingSequencesGiveWayToTheOldest) {
  auto s = make(small_options(4));
  FakeExecutor ex(4, 4, kVocab);
  std::mt19937 rng(6);
  const std::vector<TokenId> a = random_tokens(rng, 13);  // with 3 tokens: all 4 blocks
  const std::vector<TokenId> b = random_tokens(rng, 6);   // 1 full block + 1 token + the last
  const Scheduler::Reservation r = s->reserve_blocks({}, 1);
  ASSERT_EQ(r.fresh.size(), 1u);
  ASSERT_TRUE(s->add(spec(1, a, 3, std::nullopt)).ok());
  SequenceSpec with_tail = spec(2, b, 2, std::nullopt);
  with_tail.prefilled_tail_block = r.fresh[0];
  with_tail.prefilled_tail_tokens = 1;
  ASSERT_TRUE(s->add(std::move(with_tail)).ok());
  StepPlan p = s->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);  // was: none, with both sequences waiting
  EXPECT_EQ(p.chunks[0].seq_id, 1u);
  std::map<SequenceId, std::vector<TokenId>> out;
  auto result = ex.execute(p);
  ASSERT_TRUE(result.ok());
  for (const auto& u : s->update(p, *result)) {
    for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
  }
  run_to_completion(*s, ex, &out);
  EXPECT_EQ(out[1], reference_generate(a, 3, kVocab, std::nullopt));
  EXPECT_EQ(out[2], reference_generate(b, 2, kVocab, std::nullopt));
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

TEST(SchedulerTest, PublishesOnlyBlocksWhoseKvIsComputed) {
  SchedulerOptions o = small_options(64);
  o.max_num_batched_tokens = 6;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(4);
  std::vector<TokenId> prompt = random_tokens(rng, 13);
  std::vector<BlockHash> chain;
  extend_block_hash_chain(prompt, 4, &chain);
  ASSERT_EQ(chain.size(), 3u);
  ASSERT_TRUE(s->add(spec(1, prompt, 3, std::nullopt)).ok());
  const std::vector<size_t> expected_published = {1, 3, 3};  // after 6, 12, 13 tokens
  for (size_t step = 0; step < expected_published.size(); ++step) {
    StepPlan p = s->schedule();
    auto r = ex.execute(p);
    ASSERT_TRUE(r.ok());
    // Nothing is published before the step that computes it has finished.
    EXPECT_EQ(s->block_pool().match_prefix(chain).size(),
              step == 0 ? 0 : expected_published[step - 1]);
    s->update(p, *r);
    EXPECT_EQ(s->block_pool().match_prefix(chain).size(), expected_published[step]) << step;
  }
}

TEST(SchedulerTest, FullyCachedPromptStillComputesItsLastToken) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::vector<TokenId> prompt = {9, 10, 11, 12, 13, 14, 15, 16};  // exactly 2 blocks
  ASSERT_TRUE(s->add(spec(1, prompt, 1, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  ASSERT_TRUE(s->add(spec(2, prompt, 1, std::nullopt)).ok());
  StepPlan p = s->schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start_pos, 4);  // one block shared, the last block recomputed
  auto r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  s->update(p, *r);
  EXPECT_EQ(out[1], reference_generate(prompt, 1, kVocab, std::nullopt));
}

TEST(SchedulerTest, FinishFreesBlocksAndStopsScheduling) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  ASSERT_TRUE(s->add(spec(1, std::vector<TokenId>(9, 20), 50, std::nullopt)).ok());
  StepPlan p = s->schedule();
  auto r = ex.execute(p);
  ASSERT_TRUE(r.ok());
  s->update(p, *r);
  EXPECT_GT(s->stats().num_used_blocks, 0);
  s->finish(1, FinishReason::kAbort);
  EXPECT_EQ(s->stats().num_used_blocks, 0);
  EXPECT_FALSE(s->has_work());
  EXPECT_EQ(s->find(1), nullptr);
  s->finish(12345, FinishReason::kAbort);  // unknown ids are ignored
}

TEST(SchedulerTest, StopTokensEosAndLength) {
  auto s = make(small_options(64));
  FakeExecutor ex(64, 4, kVocab);
  std::vector<TokenId> prompt = {20, 21, 22};
  std::vector<TokenId> ref = reference_generate(prompt, 10, kVocab, std::nullopt);
  // Stop on the third generated token via stop_token_ids.
  SequenceSpec a = spec(1, prompt, 10, std::nullopt);
  a.stop_token_ids = {ref[2]};
  ASSERT_TRUE(s->add(a).ok());
  // Treat the second generated token as EOS.
  ASSERT_TRUE(s->add(spec(2, prompt, 10, ref[1])).ok());
  // Length.
  ASSERT_TRUE(s->add(spec(3, prompt, 4, std::nullopt)).ok());
  // Several EOS ids (a config's eos_token_id list): the second of them ends it.
  SequenceSpec d = spec(4, prompt, 10, std::nullopt);
  d.eos_token_ids = {kVocab - 1, ref[3]};
  const bool listed_first_appears =
      std::find(ref.begin(), ref.begin() + 4, kVocab - 1) != ref.begin() + 4;
  ASSERT_FALSE(listed_first_appears) << "pick another unused id";
  ASSERT_TRUE(s->add(d).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  std::map<SequenceId, FinishReason> reasons;
  run_to_completion(*s, ex, &out, &reasons);
  auto first = [&](size_t n) { return std::vector<TokenId>(ref.begin(), ref.begin() + n); };
  // The stop/EOS token itself is part of the output tokens. Earlier repeats of the same id
  // would stop earlier, so compare with the first occurrence.
  auto stop_at = [&](TokenId t) {
    return static_cast<size_t>(std::find(ref.begin(), ref.end(), t) - ref.begin()) + 1;
  };
  EXPECT_EQ(out[1], first(stop_at(ref[2])));
  EXPECT_EQ(reasons[1], FinishReason::kStop);
  EXPECT_EQ(out[2], first(stop_at(ref[1])));
  EXPECT_EQ(reasons[2], FinishReason::kStop);
  EXPECT_EQ(out[3], first(4));
  EXPECT_EQ(reasons[3], FinishReason::kLength);
  EXPECT_EQ(out[4], first(stop_at(ref[3])));
  EXPECT_EQ(reasons[4], FinishReason::kStop);
}

TEST(SchedulerTest, ContextLengthEndsGeneration) {
  SchedulerOptions o = small_options(64);
  o.max_model_len = 12;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::vector<TokenId> prompt = {20, 21, 22, 23, 24};
  ASSERT_TRUE(s->add(spec(1, prompt, 7, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  std::map<SequenceId, FinishReason> reasons;
  run_to_completion(*s, ex, &out, &reasons);
  EXPECT_EQ(out[1].size(), 7u);
  EXPECT_EQ(reasons[1], FinishReason::kLength);
}

// Many sequences with shared prefixes, a small pool (preemption), a small budget (chunked
// prefill), few slots and sequences arriving while others run: every sequence must produce
// exactly its reference tokens, and the pool must end empty.
TEST(SchedulerTest, RandomWorkloadMatchesReferenceGeneration) {
  for (bool caching : {true, false}) {
    for (int32_t block_size : {1, 4, 16}) {
      SchedulerOptions o = small_options(/*num_blocks=*/320 / block_size, block_size);
      o.max_num_seqs = 6;
      o.max_num_batched_tokens = 24;
      o.block_pool.enable_prefix_caching = caching;
      auto s = make(o);
      FakeExecutor ex(o.block_pool.num_blocks, block_size, kVocab);
      std::mt19937 rng(77 + block_size);
      std::vector<std::vector<TokenId>> prefixes = {random_tokens(rng, 37), random_tokens(rng, 9)};
      std::map<SequenceId, std::vector<TokenId>> prompts;
      std::map<SequenceId, int32_t> max_tokens;
      std::map<SequenceId, std::vector<TokenId>> out;
      SequenceId next_id = 1;
      auto add_random = [&] {
        std::vector<TokenId> p;
        if (rng() % 3 != 0) p = prefixes[rng() % prefixes.size()];
        auto tail = random_tokens(rng, 1 + static_cast<int>(rng() % 20));
        p.insert(p.end(), tail.begin(), tail.end());
        const int32_t mt = 1 + static_cast<int32_t>(rng() % 40);
        prompts[next_id] = p;
        max_tokens[next_id] = mt;
        ASSERT_TRUE(s->add(spec(next_id, p, mt)).ok());
        ++next_id;
      };
      for (int i = 0; i < 10; ++i) add_random();
      for (int step = 0; step < 20000 && (s->has_work() || next_id <= 40); ++step) {
        if (next_id <= 40 && rng() % 4 == 0) add_random();
        if (!s->has_work()) continue;
        StepPlan plan = s->schedule();
        ASSERT_FALSE(plan.empty());
        ASSERT_LE(plan.num_batched_tokens, o.max_num_batched_tokens);
        ASSERT_LE(s->stats().num_running, o.max_num_seqs);
        auto result = ex.execute(plan);
        ASSERT_TRUE(result.ok()) << result.status().to_string();
        for (const SequenceUpdate& u : s->update(plan, *result)) {
          for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
        }
      }
      ASSERT_FALSE(s->has_work());
      for (const auto& [id, prompt] : prompts) {
        ASSERT_EQ(out[id], reference_generate(prompt, max_tokens[id], kVocab, kEos))
            << "sequence " << id << " caching=" << caching << " block_size=" << block_size;
      }
      EXPECT_EQ(s->stats().num_used_blocks, 0);
      if (caching) {
        EXPECT_GT(s->stats().pool.prefix_hit_tokens, 0);
      }
    }
  }
}

TEST(SchedulerTest, RandomWorkloadUnderMemoryPressurePreemptsAndStaysCorrect) {
  SchedulerOptions o = small_options(/*num_blocks=*/24, /*block_size=*/4);
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 20;
  auto s = make(o);
  FakeExecutor ex(24, 4, kVocab);
  std::mt19937 rng(2024);
  std::vector<TokenId> prefix = random_tokens(rng, 10);
  std::map<SequenceId, std::vector<TokenId>> prompts;
  for (SequenceId id = 1; id <= 20; ++id) {
    std::vector<TokenId> p = prefix;
    auto tail = random_tokens(rng, 1 + static_cast<int>(rng() % 8));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts[id] = p;
    ASSERT_TRUE(s->add(spec(id, p, 40, std::nullopt)).ok());
  }
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);
  EXPECT_GT(s->stats().num_preemptions, 0);
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(out[id], reference_generate(prompt, 40, kVocab, std::nullopt)) << id;
  }
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

// prompt_logprobs (vLLM's): every prompt token after the first gets exactly one entry, in
// order, on the sequence's first update, however the prompt was computed: never from the
// prefix cache, in chunks, and again after a preemption (which must not repeat entries).
void expect_prompt_logprobs(const std::vector<TokenId>& prompt,
                            const std::vector<PromptTokenLogprob>& got, SequenceId id) {
  ASSERT_EQ(got.size(), prompt.size() - 1) << "sequence " << id;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, prompt[i + 1]) << "sequence " << id << " entry " << i;
    EXPECT_EQ(got[i].logprob, -static_cast<float>(i + 1)) << "sequence " << id << " entry " << i;
  }
}

TEST(SchedulerTest, PromptLogprobsComputeTheWholePromptDespiteThePrefixCache) {
  SchedulerOptions o = small_options(64);
  o.max_num_batched_tokens = 8;  // the 18-token prompt goes in three chunks
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(41);
  const std::vector<TokenId> prompt = random_tokens(rng, 18);
  ASSERT_TRUE(s->add(spec(1, prompt, 4, std::nullopt)).ok());
  std::map<SequenceId, std::vector<TokenId>> out;
  run_to_completion(*s, ex, &out);  // its 4 full blocks are now cached

  SequenceSpec with_logprobs = spec(2, prompt, 4, std::nullopt);
  with_logprobs.prompt_logprobs = 3;
  ASSERT_TRUE(s->add(with_logprobs).ok());
  std::vector<PromptTokenLogprob> got;
  int updates_with_logprobs = 0;
  int64_t first_start = -1;
  while (s->has_work()) {
    StepPlan plan = s->schedule();
    for (const ScheduledChunk& c : plan.chunks) {
      if (first_start < 0) first_start = c.start_pos;
      EXPECT_EQ(c.prompt_logprobs, c.start_pos + 1 < 18 ? 3 : -1) << "chunk at " << c.start_pos;
    }
    auto r = ex.execute(plan);
    ASSERT_TRUE(r.ok());
    for (const SequenceUpdate& u : s->update(plan, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
      if (!u.prompt_logprobs.empty()) {
        ++updates_with_logprobs;
        got = u.prompt_logprobs;
        EXPECT_EQ(u.num_cached_prompt_tokens, 0);
      }
    }
  }
  EXPECT_EQ(first_start, 0);  // no prefix-cache hit
  EXPECT_EQ(updates_with_logprobs, 1);
  expect_prompt_logprobs(prompt, got, 2);
  EXPECT_EQ(out[2], out[1]);
}

TEST(SchedulerTest, PromptLogprobsSurvivePreemptionMidPromptWithoutRepeats) {
  SchedulerOptions o = small_options(/*num_blocks=*/20, /*block_size=*/4);
  o.max_num_batched_tokens = 6;
  auto s = make(o);
  FakeExecutor ex(20, 4, kVocab);
  std::mt19937 rng(43);
  const std::vector<TokenId> prefix = random_tokens(rng, 9);
  std::map<SequenceId, std::vector<TokenId>> prompts;
  for (SequenceId id = 1; id <= 8; ++id) {
    std::vector<TokenId> p = prefix;
    auto tail = random_tokens(rng, 12 + static_cast<int>(rng() % 8));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts[id] = p;
    SequenceSpec sp = spec(id, p, 24, std::nullopt);
    if (id % 2 == 0) sp.prompt_logprobs = 1;
    ASSERT_TRUE(s->add(sp).ok());
  }
  std::map<SequenceId, std::vector<TokenId>> out;
  std::map<SequenceId, std::vector<PromptTokenLogprob>> logprobs;
  std::map<SequenceId, int> logprob_updates;
  int preempted_mid_prompt = 0;
  for (int guard = 0; s->has_work() && guard < 100000; ++guard) {
    StepPlan plan = s->schedule();
    for (SequenceId id : plan.preempted) {
      if (id % 2 == 0 && out[id].empty() && logprob_updates[id] == 0) ++preempted_mid_prompt;
    }
    auto r = ex.execute(plan);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (const SequenceUpdate& u : s->update(plan, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
      if (!u.prompt_logprobs.empty()) {
        ++logprob_updates[u.seq_id];
        logprobs[u.seq_id] = u.prompt_logprobs;
      }
    }
  }
  EXPECT_GT(preempted_mid_prompt, 0) << "the workload no longer preempts a prompt half done";
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(out[id], reference_generate(prompt, 24, kVocab, std::nullopt)) << id;
    if (id % 2 == 0) {
      EXPECT_EQ(logprob_updates[id], 1) << id;
      expect_prompt_logprobs(prompt, logprobs[id], id);
    } else {
      EXPECT_EQ(logprob_updates[id], 0) << id;
    }
  }
  EXPECT_EQ(s->stats().num_used_blocks, 0);
}

// Each prompt token owing logprobs costs a vocabulary-wide logits row: such a sequence
// computes at most max_prompt_logprobs_tokens of them per step, the others are not capped.
TEST(SchedulerTest, PromptLogprobsChunksAreCapped) {
  SchedulerOptions o = small_options(64);
  o.max_num_batched_tokens = 32;
  o.max_prompt_logprobs_tokens = 5;
  auto s = make(o);
  FakeExecutor ex(64, 4, kVocab);
  std::mt19937 rng(53);
  const std::vector<TokenId> prompt = random_tokens(rng, 18);
  SequenceSpec capped = spec(1, prompt, 2, std::nullopt);
  capped.prompt_logprobs = 0;
  ASSERT_TRUE(s->add(capped).ok());
  ASSERT_TRUE(s->add(spec(2, random_tokens(rng, 18), 2, std::nullopt)).ok());
  std::vector<size_t> chunks_of_1, chunks_of_2;
  std::map<SequenceId, std::vector<TokenId>> out;
  std::vector<PromptTokenLogprob> got;
  while (s->has_work()) {
    StepPlan plan = s->schedule();
    for (const ScheduledChunk& c : plan.chunks) {
      (c.seq_id == 1 ? chunks_of_1 : chunks_of_2).push_back(c.tokens.size());
    }
    auto r = ex.execute(plan);
    ASSERT_TRUE(r.ok());
    for (const SequenceUpdate& u : s->update(plan, *r)) {
      for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
      if (!u.prompt_logprobs.empty()) got = u.prompt_logprobs;
    }
  }
  // 17 positions owe logprobs: 5, 5, 5, then the last 3 (two owed, the last prompt token
  // samples), then one decode step.
  EXPECT_EQ(chunks_of_1, (std::vector<size_t>{5, 5, 5, 3, 1}));
  EXPECT_EQ(chunks_of_2.front(), 18u);
  expect_prompt_logprobs(prompt, got, 1);
  EXPECT_EQ(out[1], reference_generate(prompt, 2, kVocab, std::nullopt));
}

// The other choices of a request with prompt logprobs start after choice 0 has sent them, so
// a stream never has another choice's tokens before the request's prompt logprobs.
TEST(SchedulerTest, OtherChoicesWaitForChoiceZerosPromptLogprobs) {
  for (const bool prefix_caching : {true, false}) {
    SchedulerOptions o = small_options(64);
    o.max_num_batched_tokens = 8;
    o.block_pool.enable_prefix_caching = prefix_caching;
    auto s = make(o);
    FakeExecutor ex(64, 4, kVocab);
    std::mt19937 rng(47);
    const std::vector<TokenId> prompt = random_tokens(rng, 21);
    SequenceSpec first = spec(1, prompt, 3, std::nullopt);
    first.prompt_logprobs = 0;
    SequenceSpec second = spec(2, prompt, 3, std::nullopt);
    second.prompt_from = 1;
    ASSERT_TRUE(s->add(first).ok());
    ASSERT_TRUE(s->add(second).ok());
    bool logprobs_sent = false;
    std::map<SequenceId, std::vector<TokenId>> out;
    while (s->has_work()) {
      StepPlan plan = s->schedule();
      for (const ScheduledChunk& c : plan.chunks) {
        if (c.seq_id == 2) {
          EXPECT_TRUE(logprobs_sent) << "prefix caching " << prefix_caching;
        }
      }
      auto r = ex.execute(plan);
      ASSERT_TRUE(r.ok());
      for (const SequenceUpdate& u : s->update(plan, *r)) {
        for (const SampledToken& t : u.tokens) out[u.seq_id].push_back(t.token);
        if (u.seq_id == 1 && !u.prompt_logprobs.empty()) logprobs_sent = true;
        EXPECT_TRUE(u.seq_id == 1 || u.prompt_logprobs.empty());
      }
    }
    EXPECT_TRUE(logprobs_sent);
    EXPECT_EQ(out[2], out[1]);
  }
}

}  // namespace
}  // namespace peerserve
