// StepPlan / StepResult: what the scheduler asks the executor to run in one step, and what
// comes back. Plain data, so the same plan can drive the model, a fake in tests or a
// simulated executor in the planner.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "runtime/speculative_sampler.h"

namespace peerserve {

struct ScheduledChunk {
  SequenceId seq_id = 0;
  // Positions [start_pos, start_pos + tokens.size()) are computed in this step.
  int64_t start_pos = 0;
  // The known tokens, then the draft tokens to verify (speculative decoding).
  std::vector<TokenId> tokens;
  // Covers [0, start_pos + tokens.size()).
  std::vector<BlockId> block_table;
  // The chunk reaches the end of the sequence's known tokens: sample the next token.
  bool sample = false;
  // For the sampler (valid until Scheduler::update): the request's parameters, seed and the
  // tokens it generated so far.
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;
  std::span<const TokenId> generated;
  std::span<const TokenId> prompt;  // for repetition_penalty
  // Prompt logprobs (SequenceSpec::prompt_logprobs alternatives; -1: none) for the prompt
  // tokens after positions [prompt_logprobs_from, prompt tokens - 1) of this chunk.
  int32_t prompt_logprobs = -1;
  int64_t prompt_logprobs_from = 0;

  // Speculative decoding (SchedulerOptions::num_speculative_tokens > 0).
  // The drafts at the end of `tokens` (valid until Scheduler::update); empty when none.
  std::span<const DraftToken> drafts;
  // Drafts to propose after this step (0: none; the MTP layer still runs over the chunk's
  // positions, so that its KV stays complete).
  int32_t num_lookahead = 0;
  // A chunk that does not sample: the known token after it (the MTP layer at the chunk's
  // last position reads it).
  TokenId next_token = -1;
  int64_t num_known_tokens() const { return static_cast<int64_t>(tokens.size() - drafts.size()); }
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<ScheduledChunk> chunks;
  // Sequences preempted (blocks freed, to be recomputed) while making this plan.
  std::vector<SequenceId> preempted;
  int64_t num_batched_tokens = 0;
  // Of those, tokens of chunks that are not a single decode token.
  int64_t num_prefill_tokens = 0;
  // Speculative decoding is on for this step: the executor runs the MTP layer over every new
  // position (keeping its KV complete) and drafts where chunks ask for it.
  bool speculative = false;

  bool empty() const { return chunks.empty(); }
};

struct ChunkResult {
  // Empty unless chunk.sample: the accepted drafts, in order, then one sampled token (the
  // replacement of the first rejected draft, or the token after the last accepted one).
  std::vector<SampledToken> tokens;
  // Drafts proposed for the next step (speculative decoding), at most chunk.num_lookahead.
  std::vector<DraftToken> drafts;
  // chunk.prompt_logprobs: one per position from chunk.prompt_logprobs_from on that has a
  // prompt token after it, in order.
  std::vector<PromptTokenLogprob> prompt_logprobs;
};

struct StepResult {
  // One entry per chunk of the plan, in order.
  std::vector<ChunkResult> chunks;
};

// What happened to one sequence in a step (only sequences that sampled a token or ended).
struct SequenceUpdate {
  SequenceId seq_id = 0;
  // The new tokens, in order (more than one when drafts were accepted).
  std::vector<SampledToken> tokens;
  // Drafts verified in this step and how many of them were accepted (a run from the first).
  int32_t num_drafts = 0;
  int32_t num_accepted_drafts = 0;
  std::optional<FinishReason> finish_reason;
  std::optional<TokenId> stop_token;     // the stop token id / EOS that ended it
  bool stopped_on_eos = false;           // stop_token is an EOS id, not a stop_token_ids one
  int64_t num_cached_prompt_tokens = 0;  // prompt tokens found in the prefix cache
  // SequenceSpec::prompt_logprobs: all of them, on the sequence's first update.
  std::vector<PromptTokenLogprob> prompt_logprobs;
};

}  // namespace peerserve
