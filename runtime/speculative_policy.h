// SpeculativePolicy: where MTP speculative decoding pays, decided from costs measured on
// this machine with this model (ModelExecutor::measure_speculative_costs), not guessed.
//
// With one draft per step accepted at rate a, a step emits 1 + a tokens per sequence and
// costs `speculative` (a main-model pass over 2 tokens per sequence, then the MTP layer, back
// to back as the executor runs them: the two passes evict each other's weights from the
// caches, which a separate timing of each misses), where a plain step emits 1 token for
// `decode`. So at batch b
//
//   speedup(b) = (1 + a) * decode(b) / speculative(b),
//   break-even acceptance(b) = max(0, speculative(b) / decode(b) - 1).
//
// `--speculative auto` drafts while at most b* sequences run, b* the largest measured batch
// such that speedup >= min_speedup at every measured batch up to it, with a = the prior
// acceptance. Above b* the MTP layer still runs (its KV must stay complete for drafting to
// resume), which costs (decode_mtp(b) - decode(b)) / decode(b); auto is on only if that stays
// within max_idle_overhead at the larger measured batches, else it is off altogether. The engine
// also turns speculation off for good when the observed acceptance stays below the
// break-even at batch 1 (a useless MTP head).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peerserve {

struct SpeculativeCost {
  int32_t batch = 0;
  double decode_s = 0;       // one decode step of `batch` sequences
  double decode_mtp_s = 0;   // the same, then the MTP layer's KV only (MtpChunk::kv_only) at
                             // one position per sequence: a step that drafts nothing
  double speculative_s = 0;  // the main model over 2 tokens per sequence (all logits), then
                             // the MTP layer over 2 positions per sequence
  double verify_s = 0;       // the first part of that alone, in the same cache state (right
                             // after a speculative step): what verifying costs however cheap
                             // the draft; not used by the policy, reported by the bench
  // Never below 0: a speculative step timed cheaper than a decode step (timing noise on a
  // loaded machine) breaks even at any acceptance, and the engine's guard takes no negative.
  double break_even_acceptance() const {
    const double excess = speculative_s / decode_s - 1.0;
    return excess > 0.0 ? excess : 0.0;
  }
  double speedup(double acceptance) const { return (1.0 + acceptance) * decode_s / speculative_s; }
  // The speedup no draft can beat at this acceptance: drafting free, verification as timed.
  double free_draft_speedup(double acceptance) const {
    return (1.0 + acceptance) * decode_s / verify_s;
  }
  // What running the MTP layer without drafting adds to a decode step.
  double idle_overhead() const { return decode_mtp_s / decode_s - 1.0; }
};

struct SpeculativePolicyOptions {
  double prior_acceptance = 0.8;    // DeepSeek-V3 reports 0.85-0.9; the shipped model 0.77
  double min_speedup = 1.05;        // predicted gain needed to draft at a batch size
  double max_idle_overhead = 0.03;  // MTP-layer cost allowed where drafting is off
};

struct SpeculativePolicy {
  bool enabled = false;
  int32_t max_running = 0;           // draft while at most this many sequences run (when enabled)
  double break_even_acceptance = 0;  // at batch 1: below it, drafting loses
  std::string reason;                // one line for the log
};

// `costs` in increasing batch order, at least one entry.
SpeculativePolicy decide_speculative_policy(const std::vector<SpeculativeCost>& costs,
                                            const SpeculativePolicyOptions& options = {});

}  // namespace peerserve
