// Sequence: the scheduler's state for one generated choice: its tokens (prompt, then
// generated), how many of them have KV in the cache, and its block table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_hash.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/speculative_sampler.h"

namespace peerserve {

using SequenceId = uint64_t;

// What the scheduler needs to know to run one sequence. Plain data.
struct SequenceSpec {
  SequenceId id = 0;
  std::vector<TokenId> prompt_tokens;  // not empty
  int32_t max_tokens = 0;              // resolved: >= 1
  SamplingParams sampling;
  uint64_t seed = 0;  // resolved seed for the sampler
  std::vector<TokenId> stop_token_ids;
  std::vector<TokenId> eos_token_ids;  // empty: never stop on EOS (ignore_eos)
  // A KV block that already holds prompt tokens [F * block_size, F * block_size +
  // prefilled_tail_tokens), F = (prompt tokens - 1) / block_size: the partial block a prefill
  // instance pushed (runtime/kv_handoff_receiver.h). The caller holds one reference on it and
  // hands it to the scheduler with add(), which uses it at the first admission when the F
  // full blocks before it are all cached, and otherwise releases it.
  std::optional<BlockId> prefilled_tail_block;
  int32_t prefilled_tail_tokens = 0;
  // EngineRequest::cache_salt: the sequence's prefix-cache chain starts at the scheduler's
  // root salted with it (kv/prefix_hash.h salted_root_hash).
  std::string cache_salt;
  // GenerationParams::prompt_logprobs (-1: none); only choice 0 of a request asks for them.
  int32_t prompt_logprobs = -1;
  // Another sequence with the same prompt (choice 0 of the same request). While it runs and
  // has not computed the prompt's shareable blocks yet, this one is not admitted: it then
  // finds them in the prefix cache instead of computing (and holding) the prompt again, as
  // vLLM forks a request's choices after its prompt.
  std::optional<SequenceId> prompt_from;
};

enum class SequenceStatus { kWaiting, kRunning, kFinished };

struct Sequence {
  SequenceSpec spec;
  uint64_t arrival_order = 0;  // FCFS position
  SequenceStatus status = SequenceStatus::kWaiting;
  std::optional<FinishReason> finish_reason;

  // Prompt, then generated tokens.
  std::vector<TokenId> tokens;
  // Tokens whose KV is in the cache: [0, num_computed_tokens).
  int64_t num_computed_tokens = 0;
  std::vector<BlockId> block_table;
  // Hash chain of the full blocks of `tokens` (kept across preemption), from prefix_root.
  BlockHash prefix_root = kRootBlockHash;
  std::vector<BlockHash> block_hashes;
  // Leading blocks of block_table that are in the prefix-cache index (shared or published).
  int64_t num_published_blocks = 0;
  // Prompt tokens found in the prefix cache at first admission (usage.cached_tokens).
  int64_t num_cached_prompt_tokens = 0;
  int32_t num_preemptions = 0;
  bool admitted_once = false;
  // spec.prompt_logprobs: those of prompt tokens 1 .. num_prompt_logprobs (computed at
  // positions 0 .. num_prompt_logprobs - 1), kept until the first sampled token goes out
  // with them (prompt_logprobs_sent()).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  int64_t num_prompt_logprobs = 0;
  // Speculative decoding: draft tokens for positions num_tokens(), num_tokens() + 1, ...
  // (made by the MTP layer in the last step; dropped when the sequence loses its KV).
  std::vector<DraftToken> drafts;

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(spec.prompt_tokens.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - num_prompt_tokens(); }
  // The prompt logprobs went out with the first generated token (kept across preemption).
  bool prompt_logprobs_sent() const { return num_generated() > 0; }
  // Prompt logprobs still to compute: positions num_prompt_logprobs .. prompt tokens - 2.
  bool wants_prompt_logprobs() const {
    return spec.prompt_logprobs >= 0 && !prompt_logprobs_sent() &&
           num_prompt_logprobs < num_prompt_tokens() - 1;
  }
  std::span<const TokenId> generated() const {
    return std::span<const TokenId>(tokens).subspan(spec.prompt_tokens.size());
  }
  // Tokens this sequence can reach at most: prompt + max_tokens, within the context.
  int64_t max_length(int64_t max_model_len) const {
    return std::min<int64_t>(num_prompt_tokens() + spec.max_tokens, max_model_len);
  }
};

}  // namespace peerserve
