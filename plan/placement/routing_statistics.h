// Summary statistics of routing traces, the ones paper 004 §III reports, so that a trace
// (published or synthetic) can be compared with the paper's observations.
#pragma once

#include <span>
#include <vector>

#include "base/status.h"
#include "plan/placement/routing_trace.h"

namespace peerserve::plan {

struct RoutingStatistics {
  // Per MoE layer: selections of the hottest expert / mean selections per expert (Ob4).
  std::vector<double> max_over_mean;
  // Mean over adjacent token pairs (same request, same layer) of |S_t ∩ S_{t-1}| / k: the
  // diagonal of the cross-token heatmap (Ob2). Independent draws give sum(pi^2)/k.
  double token_repeat_fraction = 0.0;
  // Mean over layers of |top-N(prefill) ∩ top-N(decode)| / N for N = 5, 10, 20 (Ob3, Fig. 7b);
  // empty when the traces have no decode steps.
  std::vector<double> prefill_decode_top_overlap;
};

Result<RoutingStatistics> routing_statistics(std::span<const RequestRouting> requests,
                                             int num_experts);

}  // namespace peerserve::plan
