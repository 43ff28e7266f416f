// The two-microbatch pipeline (paper 000 §4.2.3 decode, §4.3.2 prefill): a step's chunks
// split into two microbatches, each with its own ForwardState, whose stages interleave so
// that one microbatch computes while the other's expert exchange is in flight.
//
// Policy: a microbatch hands over to the other before its experts and its combine stages
// (the stages that involve the other processes), and whenever its next stage would wait on
// them (ExpertBackend::ready() false: under expert parallelism, a peer's dispatch or results
// not here yet) while the other's would not. When both would wait, the current one waits
// in its stage. With a local backend nothing waits, and the order is: A up to its experts,
// B up to its experts, A's experts, B's experts, A's combine and next attention, ... (the
// interleaving of §4.2.3), with no gain but no loss beyond bookkeeping.
//
// The split: chunks stay whole (a chunk's tokens depend on each other's KV) and in order;
// the split point is the one that balances the two microbatches' rows (tokens) best, the
// first taking more on a tie. Decode steps thus split their sequences evenly; a step with
// one chunk runs as one microbatch, except under a collective backend, where every rank
// runs both (the second possibly empty) so that the ranks' exchanges pair up. Rows are the right
// measure because every stage's cost grows with them (GEMM rows, routed tokens); attention over
// long contexts is the exception, and a prefill chunk usually dominates both halves' cost anyway.
// The result equals the single-microbatch forward bitwise, because every row's value is independent
// of the rows it shares a batch with.
//
// When to split (MicrobatchSplit): kMeasured (the default) splits the steps whose size the
// MicrobatchPolicy measured to run faster split, so that the pipeline is never slower than
// one microbatch beyond its exploration; kAlways splits every step it can. Under lock-step
// (a collective backend) every rank must split the same steps: the caller posts proposal()
// to the group's agreement and hands the leader's proposal and the group's token count to
// follow_agreement() before each forward.
//
// Thread-safety: one forward at a time (the engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/microbatch_policy.h"

namespace peerserve {

enum class MicrobatchSplit : uint8_t { kMeasured, kAlways };

struct MicrobatchStats {
  int64_t steps = 0;          // forward calls
  int64_t split_steps = 0;    // of which ran as two microbatches
  int64_t whole_steps = 0;    // of which the policy ran as one (though they could split)
  int64_t switches = 0;       // times the driver moved to the other microbatch
  int64_t waits_avoided = 0;  // switches made because the next stage would have waited
};

class MicrobatchPipeline {
 public:
  // The model must outlive the pipeline.
  explicit MicrobatchPipeline(DeepseekModel* model,
                              MicrobatchSplit split = MicrobatchSplit::kMeasured);

  // Lock-step: what this rank proposes for the next step (MicrobatchPolicy::plan()), and the
  // group's agreement on it (the leader's proposal, the rows all ranks bring). The next
  // forward follows it; without one, forward() decides from its own rows (and with a
  // collective backend splits every step, as every rank without an agreement does).
  uint64_t proposal() const;
  void follow_agreement(uint64_t leader_proposal, int64_t group_tokens);

  // One step, as two microbatches when the chunks can be split. Same contract and errors
  // as DeepseekModel::forward; out's rows are in chunk order.
  Status forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache, ForwardOutput* out);

  const MicrobatchStats& stats() const { return stats_; }
  const MicrobatchPolicy& policy() const { return policy_; }

 private:
  // Runs both states to kDone, interleaving by the policy above.
  Status drive();

  // Runs the step as two microbatches (split < chunks.size(), or an empty second one).
  Status forward_split(std::span<const SequenceChunk> chunks, size_t split, LatentKvCache& cache,
                       ForwardOutput* out);

  DeepseekModel* model_;
  MicrobatchSplit split_policy_;
  MicrobatchPolicy policy_;
  bool agreed_ = false;  // follow_agreement() was called for the next forward
  uint64_t agreed_plan_ = 0;
  int64_t agreed_tokens_ = 0;
  std::unique_ptr<ForwardState> states_[2];
  ForwardOutput second_output_;  // the second microbatch's rows, appended to the step's
  MicrobatchStats stats_;
};

// Index of the first chunk of the second microbatch (chunks.size() when there is one).
size_t microbatch_split_point(std::span<const SequenceChunk> chunks);

}  // namespace peerserve
