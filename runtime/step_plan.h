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

namespace peerserve {

struct ScheduledChunk {
  SequenceId seq_id = 0;
  // Positions [start_pos, start_pos + tokens.size()) are computed in this step.
  int64_t start_pos = 0;
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
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<ScheduledChunk> chunks;
  // Sequences preempted (blocks freed, to be recomputed) while making this plan.
  std::vector<SequenceId> preempted;
  int64_t num_batched_tokens = 0;
  // Of those, tokens of chunks that are not a single decode token.
  int64_t num_prefill_tokens = 0;

  bool empty() const { return chunks.empty(); }
};

struct StepResult {
  // One entry per chunk of the plan, in order: set iff chunk.sample.
  std::vector<std::optional<SampledToken>> sampled;
};

// What happened to one sequence in a step (only sequences that sampled a token or ended).
struct SequenceUpdate {
  SequenceId seq_id = 0;
  std::optional<SampledToken> token;
  std::optional<FinishReason> finish_reason;
  std::optional<TokenId> stop_token;     // the stop token id / EOS that ended it
  int64_t num_cached_prompt_tokens = 0;  // prompt tokens found in the prefix cache
};

}  // namespace peerserve
