#include "plan/placement/placement_study.h"

#include <string>

#include "plan/placement/eplb_placement.h"
#include "plan/placement/prefill_aware_placement.h"

namespace peerserve::plan {

std::string_view placement_algorithm_name(PlacementAlgorithm algorithm) {
  switch (algorithm) {
    case PlacementAlgorithm::kContiguous:
      return "contiguous";
    case PlacementAlgorithm::kEplb:
      return "eplb";
    case PlacementAlgorithm::kEplbHierarchical:
      return "eplb-hierarchical";
    case PlacementAlgorithm::kEplbGlobal:
      return "eplb-global";
    case PlacementAlgorithm::kRemap:
      return "remap";
    case PlacementAlgorithm::kDup:
      return "dup";
  }
  return "unknown";
}

Result<PlacementAlgorithm> parse_placement_algorithm(std::string_view name) {
  for (PlacementAlgorithm algorithm :
       {PlacementAlgorithm::kContiguous, PlacementAlgorithm::kEplb,
        PlacementAlgorithm::kEplbHierarchical, PlacementAlgorithm::kEplbGlobal,
        PlacementAlgorithm::kRemap, PlacementAlgorithm::kDup}) {
    if (name == placement_algorithm_name(algorithm)) return algorithm;
  }
  return invalid_argument("placement algorithm '" + std::string(name) +
                          "', expected contiguous, eplb, eplb-hierarchical, eplb-global, remap "
                          "or dup");
}

Result<ExpertLayout> place_experts(const ExpertRoutingLoad& input, const PlacementOptions& options,
                                   const ExpertTimeFn& cost) {
  PS_RETURN_IF_ERROR(input.validate());
  if (options.num_ranks < 1 || options.redundant_per_rank < 0) {
    return invalid_argument("placement: ranks = " + std::to_string(options.num_ranks) +
                            ", redundant per rank = " + std::to_string(options.redundant_per_rank) +
                            "; expected ranks >= 1 and redundant >= 0");
  }
  EplbOptions eplb;
  eplb.num_physical_experts = input.num_experts + options.num_ranks * options.redundant_per_rank;
  eplb.num_groups = options.num_groups;
  eplb.num_nodes = options.num_nodes;
  eplb.num_gpus = options.num_ranks;
  switch (options.algorithm) {
    case PlacementAlgorithm::kContiguous:
      if (options.redundant_per_rank != 0) {
        return invalid_argument("placement: the contiguous layout has no redundant slots");
      }
      return contiguous_layout(input.num_layers(), input.num_experts, options.num_ranks);
    case PlacementAlgorithm::kEplb:
      eplb.policy = EplbPolicy::kAuto;
      return eplb_placement(input, eplb);
    case PlacementAlgorithm::kEplbHierarchical:
      eplb.policy = EplbPolicy::kHierarchical;
      return eplb_placement(input, eplb);
    case PlacementAlgorithm::kEplbGlobal:
      eplb.policy = EplbPolicy::kGlobal;
      return eplb_placement(input, eplb);
    case PlacementAlgorithm::kRemap:
      if (options.redundant_per_rank != 0) {
        return invalid_argument(
            "placement: Remap keeps E/G experts per rank; use dup or eplb "
            "for redundant slots");
      }
      return remap_placement(input, options.num_ranks, cost);
    case PlacementAlgorithm::kDup:
      return dup_placement(input, options.num_ranks, options.redundant_per_rank, cost);
  }
  return internal_error("placement: unknown algorithm");
}

Result<PlacementStudy> run_placement_study(const ExpertRoutingLoad& placement_input,
                                           const ExpertRoutingLoad& evaluation_load,
                                           const PlacementOptions& options,
                                           const ExpertTimeFn& expert_time) {
  PS_RETURN_IF_ERROR(evaluation_load.validate());
  if (placement_input.num_experts != evaluation_load.num_experts ||
      placement_input.moe_layers != evaluation_load.moe_layers) {
    return invalid_argument(
        "placement study: the placement input and the evaluation load "
        "must cover the same MoE layers and experts");
  }
  PlacementStudy study;
  PS_ASSIGN_OR_RETURN(study.before,
                      contiguous_layout(placement_input.num_layers(), placement_input.num_experts,
                                        options.num_ranks));
  PS_ASSIGN_OR_RETURN(study.after, place_experts(placement_input, options, expert_time));
  PS_ASSIGN_OR_RETURN(study.before_evaluation,
                      evaluate_placement(evaluation_load, study.before, expert_time));
  PS_ASSIGN_OR_RETURN(study.after_evaluation,
                      evaluate_placement(evaluation_load, study.after, expert_time));
  return study;
}

PlacementImbalanceChart placement_imbalance_chart(const PlacementStudy& study,
                                                  const std::vector<int>& moe_layers) {
  PlacementImbalanceChart chart;
  chart.moe_layers = moe_layers;
  const auto fill = [](const PlacementEvaluation& evaluation, std::vector<double>& per_layer,
                       std::vector<double>& per_rank) {
    for (const LayerBalance& layer : evaluation.layers) {
      per_layer.push_back(layer.mean_load > 0.0 ? layer.max_load / layer.mean_load : 1.0);
      if (per_rank.empty()) per_rank.assign(layer.rank_load.size(), 0.0);
      for (size_t g = 0; g < layer.rank_load.size(); ++g) per_rank[g] += layer.rank_load[g];
    }
  };
  fill(study.before_evaluation, chart.max_over_mean_before, chart.rank_load_before);
  fill(study.after_evaluation, chart.max_over_mean_after, chart.rank_load_after);
  return chart;
}

}  // namespace peerserve::plan
