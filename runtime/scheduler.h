// Scheduler: continuous batching over a paged KV block pool, as a pure state machine.
//
//   StepPlan plan = scheduler.schedule();            // which tokens of which sequences
//   StepResult result = executor.execute(plan);      // (model forward + sampling)
//   auto updates = scheduler.update(plan, result);   // new tokens, finished sequences
//
// No clock, device, network or threads inside, so the same class runs in the engine, in
// tests with a fake executor and in a simulator.
//
// Policy (one step):
//   1. Running sequences, oldest first, each get their remaining tokens (1 for a decode, the
//      rest of the prompt for a prefill) capped by what is left of the token budget
//      (max_num_batched_tokens): long prompts are prefilled in chunks across steps, mixed
//      with the decodes of other sequences.
//   2. When the pool cannot supply a running sequence's next blocks, the newest running
//      sequence is preempted: its blocks are released and it goes back to the front of the
//      waiting queue, to be recomputed later (its published blocks stay in the prefix
//      cache, so the recompute is often cheap).
//   3. If nothing was preempted, waiting sequences are admitted strictly first come, first
//      served (the head of the queue is never overtaken, so nothing starves) while there is
//      budget, fewer than max_num_seqs are running and the pool can hold them. Admission
//      looks the prompt up in the prefix cache and shares the cached leading blocks.
//   4. Speculative decoding: what budget is left goes to the drafts of the running decodes,
//      oldest first, as far as the pool has blocks for them (drafts never preempt, and never
//      keep a sequence from its step or from admission).
//   5. update() appends the sampled tokens (several when speculative drafts were accepted),
//      ends sequences on EOS / stop token / max_tokens / context length, publishes the newly
//      filled blocks in the prefix cache and frees the blocks of finished sequences.
// Sequences that can never fit (longer than the context, or needing more blocks than the
// whole pool) are rejected by add() with a clear error.
//
// Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "runtime/sequence.h"
#include "runtime/speculative_guard.h"
#include "runtime/step_plan.h"

namespace peerserve {

// Draft tokens per sequence and step at most.
inline constexpr int32_t kMaxSpeculativeTokens = 8;

struct SchedulerOptions {
  int32_t max_num_seqs = 256;             // running sequences at most. Default 256.
  int32_t max_num_batched_tokens = 2048;  // tokens per step at most. Default 2048.
  int64_t max_model_len = 4096;           // prompt + generated tokens at most. Default 4096.
  int32_t max_waiting_seqs = 4096;        // add() fails beyond this many waiting. Default 4096.
  // Prompt tokens one sequence computes per step at most while other sequences are running
  // (0 = only max_num_batched_tokens limits). Attention of a chunk costs like that many
  // decodes, so a decode instance keeps its inter-token latency flat by admitting the
  // uncached tail of a prompt a few tokens per step. Alone, a sequence is not capped.
  // Default 0.
  int32_t max_prefill_chunk_tokens = 0;
  // Prompt tokens a sequence owing prompt logprobs computes per step at most: each needs a
  // logits row of the whole vocabulary (0 = only the limits above). Default 0.
  int32_t max_prompt_logprobs_tokens = 0;
  BlockPoolOptions block_pool;
  // Root of the prefix-cache hash chains. Default kRootBlockHash (private to this engine);
  // an engine that shares blocks through a caching pool uses its KvNamespace::root_hash().
  BlockHash prefix_root = kRootBlockHash;
  // Keep a list of the blocks published to the prefix cache (take_published_blocks()), for
  // storing them in a caching pool. Default off.
  bool record_published_blocks = false;
  // Speculative decoding: draft tokens verified per sequence and step (0 = off). A decode
  // chunk then carries the sequence's drafts after its last token (they count against
  // max_num_batched_tokens), and KV blocks are reserved for them; rejected positions are
  // rolled back (num_computed_tokens stops before them). Default 0.
  int32_t num_speculative_tokens = 0;
  // With speculative decoding: drafts are verified and proposed only in steps that start
  // with at most this many running sequences (0 = always); the executor still runs the MTP
  // layer over every new position, so drafting can resume at any step. Default 0.
  int32_t speculative_max_running = 0;
  // Guard (--speculative auto; runtime/speculative_guard.h): once this many drafts were
  // verified, speculation is turned off for good if fewer than speculative_min_acceptance of
  // them were accepted (drafting then loses; runtime/speculative_policy.h); before that, as
  // soon as the acceptance so far is significantly below it. 0 = no guard. Default 0.
  int64_t speculative_guard_drafts = 0;
  double speculative_min_acceptance = 0.0;

  // Checks every field; the message names the field.
  Status validate() const;
};

// Whether a sequence with this prompt and max_tokens can ever run: its whole length must fit
// in the context and its blocks in the pool. The message says which limit and by how much.
Status check_sequence_fits(const SchedulerOptions& options, int64_t num_prompt_tokens,
                           int64_t max_tokens);
// The largest max_tokens that check_sequence_fits accepts for this prompt (may be <= 0).
int64_t max_tokens_limit(const SchedulerOptions& options, int64_t num_prompt_tokens);

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_blocks = 0;
  int32_t num_used_blocks = 0;
  int32_t num_free_blocks = 0;
  int32_t num_cached_blocks = 0;
  int64_t num_preemptions = 0;  // total
  BlockPoolCounters pool;
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerOptions& options);

  // Queues a sequence. Errors: InvalidArgument (empty prompt, max_tokens < 1, duplicate
  // id), OutOfRange (does not fit the context or the pool), ResourceExhausted (waiting
  // queue full).
  Status add(SequenceSpec spec);

  // Ends a sequence now (abort, stop string), freeing its blocks. Unknown ids are ignored.
  // Must not be called between schedule() and update().
  void finish(SequenceId id, FinishReason reason);

  StepPlan schedule();
  std::vector<SequenceUpdate> update(const StepPlan& plan, const StepResult& result);
  // Ends a step whose execution failed: nothing of it is applied (no tokens, no published
  // blocks); the caller then finishes the plan's sequences.
  void abandon(const StepPlan& plan);

  // Speculative decoding off for good (what the guard does when drafts are rarely accepted):
  // no more drafts, and plans no longer ask for the MTP layer. Blocks computed from then on
  // hold no MTP KV, so they are hashed without lookahead (below).
  void disable_speculation();
  bool speculation_enabled() const {
    return options_.num_speculative_tokens > 0 && !speculation_disabled_;
  }
  // The lookahead prefix hashes are built with (kv/prefix_hash.h): 1 while the steps write
  // the MTP layer's KV, whose entry at a block's last position is computed from the token
  // after the block; 0 otherwise. Whoever hashes this engine's prompts for its caches (the
  // caching pool's lookups, a prefill instance's push) uses the same.
  int32_t block_hash_lookahead() const { return speculation_enabled() ? 1 : 0; }
  // Drafts verified and accepted since the start.
  int64_t drafts_verified() const { return guard_.verified(); }
  int64_t drafts_accepted() const { return guard_.accepted(); }

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // Sequences queued, not running (stats().num_waiting without the rest of stats()).
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  // nullptr for unknown or finished ids.
  const Sequence* find(SequenceId id) const;
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  const BlockPool& block_pool() const { return pool_; }

  // Leading blocks of `chain` (hashes under options().prefix_root, salted or not) cached
  // locally. Pure.
  int64_t cached_prefix_blocks(std::span<const BlockHash> chain) const;
  // Adds blocks loaded from elsewhere (a caching pool) to the prefix cache: `cached` is a
  // chain's leading part that is cached here now, `loaded` the hashes of the blocks that
  // follow it. Takes free blocks for them (as many as the free list allows, in order), calls
  // fill(i, block) to write loaded block i's KV into `block` (false stops there), publishes
  // the filled ones and releases everything again, so they are cached, evictable blocks that
  // the next admission of that prefix shares. Returns the number added: 0 when `cached` is no
  // longer cached as a whole (then the loaded blocks could not be reached). Not between
  // schedule() and update().
  int64_t adopt_blocks(std::span<const BlockHash> cached, std::span<const BlockHash> loaded,
                       const std::function<bool(size_t, BlockId)>& fill);

  // The same in two phases, for KV written by another thread meanwhile (a decode instance's
  // hand-off receiver): reserve_blocks() takes up to `count` free blocks (as many as the free
  // list allows, in order) and holds `cached` (a chain's leading part cached here now) so that
  // it is not evicted; the blocks belong to nobody and no sequence reads them. Then
  // commit_reservation() publishes fresh[i] under loaded[i] for i < filled (every one of them
  // fully written) and releases everything. An empty reservation when `cached` is no longer
  // cached as a whole. Neither between schedule() and update().
  struct Reservation {
    std::vector<BlockId> cached;
    std::vector<BlockId> fresh;
  };
  Reservation reserve_blocks(std::span<const BlockHash> cached, int64_t count);
  // Returns the number published.
  int64_t commit_reservation(const Reservation& reservation, std::span<const BlockHash> loaded,
                             int64_t filled);

  // A block newly published to the prefix cache, with whether it holds prompt tokens only.
  struct PublishedBlock {
    BlockId block = 0;
    BlockHash hash = 0;
    bool prompt = true;
  };
  // The blocks published since the last call (when options().record_published_blocks).
  // Their KV stays valid until the next schedule(). The caller copies what it keeps.
  std::vector<PublishedBlock> take_published_blocks();

 private:
  Scheduler(const SchedulerOptions& options, BlockPool pool);

  // Allocates blocks so that `seq` covers `num_tokens` tokens. false if the pool is short.
  bool grow_blocks(Sequence& seq, int64_t num_tokens);
  // Tokens whose KV slots a chunk of `num_new` known tokens and `num_drafts` drafts needs,
  // including the positions the MTP layer drafts at afterwards.
  int64_t tokens_to_cover(const Sequence& seq, int64_t num_new, int64_t num_drafts) const;
  // Drafts of `seq` that fit in a chunk after `num_new` known tokens within `budget`.
  int64_t usable_drafts(const Sequence& seq, int64_t num_new, int64_t budget) const;
  // Whether this step verifies and proposes drafts (speculative decoding on, batch small).
  bool drafting_step() const;
  // `budget` lowered to max_prefill_chunk_tokens when it applies (other sequences run).
  int64_t capped_budget(int64_t budget, bool others_running) const;
  // capped_budget, and max_prompt_logprobs_tokens while `seq` owes prompt logprobs.
  int64_t chunk_budget(const Sequence& seq, int64_t budget, bool others_running) const;
  // Admits the head of the waiting queue with up to `budget` tokens; false if it does not fit.
  bool try_admit(Sequence& seq, int64_t budget, StepPlan* plan);
  void preempt(Sequence& seq);
  void release_blocks(Sequence& seq);
  // Releases spec.prefilled_tail_block, if any.
  void drop_prefilled_tail(SequenceSpec& spec);
  // Releases the prefilled tails of the waiting sequences other than `keep` (each is only
  // a partial block of prefill saved; the memory is needed by an older sequence). Returns
  // whether any was released.
  bool release_waiting_tails(const Sequence* keep);
  // SequenceSpec::prompt_from: its sibling is running and still computing the shareable part
  // of their prompt, or has not sent the request's prompt logprobs yet.
  bool waits_for_prompt_sibling(const Sequence& seq) const;
  void publish_computed_blocks(Sequence& seq);
  // The chunk of `num_new` known tokens; drafts are added later (add_drafts), from the
  // budget the known tokens of every running sequence and the admissions leave.
  void add_chunk(Sequence& seq, int64_t num_new, StepPlan* plan);
  // Appends seq's first `num_drafts` drafts to its chunk (blocks already grown for them).
  void add_drafts(const Sequence& seq, int64_t num_drafts, ScheduledChunk* chunk,
                  StepPlan* plan) const;
  void remove(Sequence& seq, FinishReason reason);
  void insert_waiting(Sequence* seq);
  void insert_running(Sequence* seq);

  SchedulerOptions options_;
  BlockPool pool_;
  // schedule(): the running decodes that may verify drafts, with their chunk in the plan.
  struct DraftCandidate {
    Sequence* seq;
    int64_t num_new;
    size_t chunk;
  };
  std::vector<DraftCandidate> draft_candidates_;
  std::unordered_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  std::vector<Sequence*> running_;  // oldest arrival first
  std::deque<Sequence*> waiting_;   // oldest arrival first
  uint64_t next_arrival_ = 0;
  uint64_t next_step_ = 0;
  int64_t num_preemptions_ = 0;
  bool in_step_ = false;
  bool drafting_ = false;  // this step's drafting_step(), decided when it is planned
  bool speculation_disabled_ = false;
  SpeculativeGuard guard_;
  std::vector<PublishedBlock> published_;
};

}  // namespace peerserve
