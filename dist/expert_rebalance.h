// Online EPLB: from the expert loads every rank counted (ExpertLoadRecorder), a new expert
// placement with redundant experts (DeepSeek's EPLB, plan/placement/eplb_placement.h, the
// planner's one implementation), the same on every rank.
//
// The caller swaps between steps: every rank loads its new experts
// (ExpertWeightsStore), builds a new EpExpertBackend (collective) and installs it before
// the next step; requests in flight continue, since KV and routing do not depend on where
// an expert lives.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "dist/communicator.h"
#include "dist/expert_placement.h"

namespace peerserve::dist {

struct Rebalance {
  ExpertPlacement placement;
  // Max over mean of the token-expert pairs per rank, averaged over MoE layers, for the
  // summed counts under the old and the new placement, in EPLB's model: a hot expert's pairs
  // split evenly over its copies. Dispatch spreads them over the step's calls instead: in
  // one call an expert's pairs go to one copy when weight reads dominate (small multi-source
  // steps), else to the least-loaded ranks (ExpertExchange::dispatch), so one step's per-rank
  // load can be further from even than this.
  double before_max_over_mean = 1.0;
  double after_max_over_mean = 1.0;
  int64_t pairs = 0;  // token-expert pairs counted, all ranks
  // False when EPLB's placement would not lower the imbalance: `placement` is then the
  // current one (after = before), and there is nothing to swap.
  bool changed() const { return after_max_over_mean < before_max_over_mean; }
};

// Collective. local_counts is [layer * num_experts + expert] over decoder layers
// [0, local_counts.size() / num_experts) (this rank's counts since the last rebalance).
Result<Rebalance> rebalance_experts(Communicator& comm, std::span<const int64_t> local_counts,
                                    const ExpertPlacement& current, int redundant_experts,
                                    std::chrono::milliseconds timeout);

// Max over mean of the pairs per rank under `placement`, averaged over its MoE layers, for
// counts laid out as above (1.0 when nothing was counted).
Result<double> placement_imbalance(std::span<const int64_t> counts, int num_experts,
                                   const ExpertPlacement& placement);

}  // namespace peerserve::dist
