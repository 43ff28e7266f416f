// One placement decision and its effect: place experts from one load (e.g. the prefill
// routing of a batch, or EPLB's collected statistics), then compare the default contiguous
// layout with the new one under another load (e.g. the decode routing of the same batch):
// max/mean token-expert load per rank and the predicted MoE time, before and after.
#pragma once

#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/placement/expert_layout.h"
#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {

enum class PlacementAlgorithm {
  kContiguous,  // the default layout, no redundancy
  kEplb,        // DeepSeek EPLB, hierarchical when groups divide by nodes, else global
  kEplbHierarchical,
  kEplbGlobal,
  kRemap,  // paper 004 Algorithm 2
  kDup,    // paper 004 Algorithm 2
};
std::string_view placement_algorithm_name(PlacementAlgorithm algorithm);
// "contiguous", "eplb", "eplb-hierarchical", "eplb-global", "remap", "dup".
Result<PlacementAlgorithm> parse_placement_algorithm(std::string_view name);

struct PlacementOptions {
  PlacementAlgorithm algorithm = PlacementAlgorithm::kEplb;
  int num_ranks = 8;           // EP degree
  int redundant_per_rank = 0;  // EPLB and Dup: extra expert slots on every rank
  int num_groups = 1;          // EPLB: expert groups (DeepSeek-V3: 8)
  int num_nodes = 1;           // EPLB: nodes, each with num_ranks/num_nodes ranks
};

// Places the experts of every layer of `input`. Remap and Dup weigh experts by
// `cost(count)`; EPLB balances raw counts, as eplb.py does.
Result<ExpertLayout> place_experts(const ExpertRoutingLoad& input, const PlacementOptions& options,
                                   const ExpertTimeFn& cost);

struct PlacementStudy {
  ExpertLayout before;  // contiguous
  ExpertLayout after;
  PlacementEvaluation before_evaluation;
  PlacementEvaluation after_evaluation;

  // Predicted MoE time before / after.
  double speedup() const {
    return after_evaluation.moe_time > 0.0 ? before_evaluation.moe_time / after_evaluation.moe_time
                                           : 1.0;
  }
};

// Places from `placement_input` and evaluates both layouts on `evaluation_load` with
// `expert_time` (also the placement cost). The two loads must share layers and experts.
Result<PlacementStudy> run_placement_study(const ExpertRoutingLoad& placement_input,
                                           const ExpertRoutingLoad& evaluation_load,
                                           const PlacementOptions& options,
                                           const ExpertTimeFn& expert_time);

// Chart data: load imbalance before and after.
struct PlacementImbalanceChart {
  std::vector<int> moe_layers;               // decoder-layer index of each point
  std::vector<double> max_over_mean_before;  // per layer
  std::vector<double> max_over_mean_after;
  std::vector<double> rank_load_before;  // per rank, summed over layers
  std::vector<double> rank_load_after;
};
PlacementImbalanceChart placement_imbalance_chart(const PlacementStudy& study,
                                                  const std::vector<int>& moe_layers);

}  // namespace peerserve::plan
