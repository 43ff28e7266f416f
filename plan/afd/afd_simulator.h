// A discrete-event simulator of one rA–1F bundle with the semantics of paper 003 §5.1:
// r Attention instances and one shared FFN instance; two batches in flight (while the FFN
// works on one, the Attention instances work on the other); a barrier before every FFN step
// (all r microbatches must have arrived); continuous batching (a finished request's slot is
// refilled before the next step); geometric decode lengths.
//
// Each batch holds one microbatch of B requests per Attention instance. One step of a batch:
//   Attention (each instance, t_A of its own token load) -> A2F transfer (t_C/2) -> wait for
//   all r arrivals and a free FFN -> FFN (t_F(rB)) -> F2A transfer (t_C/2) -> wait for the
//   instance to finish the other batch -> next step.
// The paper does not say how t_C splits between directions; we use half each way. Both
// resources serve the batches in the same cyclic order, so the schedule is a recurrence over
// rounds rather than a general event queue.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "plan/afd/afd_model.h"

namespace peerserve::plan {

// The paper only needs the mean prompt length; these are the shapes we offer for sampling it.
enum class PrefillLengthDistribution {
  kConstant,     // every request has mu_P prompt tokens
  kUniform,      // uniform on [0, 2·mu_P] (bounded, as the paper's model assumes)
  kExponential,  // exponential with mean mu_P (unbounded: a heavier straggler test)
};

struct AfdSimulationOptions {
  int attention_instances = 8;  // r; the simulated bundle is rA–1F with integer r
  int batches_in_flight = 2;    // the paper's simulator uses 2
  PrefillLengthDistribution prefill_distribution = PrefillLengthDistribution::kUniform;
  double measured_fraction = 0.8;  // eq. 21 measures the first ⌈0.8·N⌉ completions
  uint64_t seed = 1;

  Status validate() const;
};

struct AfdSimulationResult {
  int attention_instances = 0;
  double total_time = 0.0;  // time of the last step's F2A arrival
  int64_t completed_requests = 0;
  int64_t generated_tokens = 0;  // one per occupied slot per step (eq. 6's rB per cycle)
  int64_t ffn_steps = 0;         // FFN executions (rounds)
  // Eq. 21: tokens of the first ⌈f·N_total⌉ completed requests over the time they took,
  // divided by r + 1. N_total = r·N (N per Attention instance, as in "N requests complete
  // per Attention instance"). Counts only finished requests, so it reads a little low.
  double throughput_per_instance = 0.0;
  // Every generated token over the whole run, divided by r + 1: the quantity eq. 6 predicts.
  double token_rate_per_instance = 0.0;
  double attention_idle = 0.0;   // eq. 23: mean over instances of idle time / total time
  double ffn_idle = 0.0;         // eq. 23
  double mean_tpot = 0.0;        // eq. 22 over requests with >= 2 tokens (first to last token)
  double mean_token_load = 0.0;  // T per microbatch step, averaged over all steps
};

// REQUIRES nothing; returns InvalidArgument for a workload without a finite N, a non-integer
// B, or bad options. Deterministic for a given seed.
Result<AfdSimulationResult> simulate_afd(const AfdLatencyModel& model, const AfdWorkload& workload,
                                         const AfdSimulationOptions& options);

}  // namespace peerserve::plan
