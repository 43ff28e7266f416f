#include "plan/placement/placement_report.h"

#include <cstdio>

#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {
namespace {

PlacementReportEntry entry_of(std::string_view algorithm, const ExpertLayout& layout,
                              const PlacementEvaluation& evaluation, double default_time) {
  PlacementReportEntry entry;
  entry.algorithm = std::string(algorithm);
  entry.slots_per_rank = layout.slots_per_rank;
  entry.mean_max_over_mean = evaluation.mean_max_over_mean;
  entry.worst_max_over_mean = evaluation.worst_max_over_mean;
  entry.moe_time = evaluation.moe_time;
  entry.speedup = evaluation.moe_time > 0.0 ? default_time / evaluation.moe_time : 1.0;
  entry.rank_load.assign(static_cast<size_t>(layout.num_ranks), 0.0);
  for (const LayerBalance& layer : evaluation.layers) {
    entry.max_over_mean.push_back(layer.mean_load > 0.0 ? layer.max_load / layer.mean_load : 1.0);
    for (size_t g = 0; g < layer.rank_load.size(); ++g) entry.rank_load[g] += layer.rank_load[g];
  }
  return entry;
}

}  // namespace

SyntheticRoutingOptions PlacementReportOptions::default_routing() {
  SyntheticRoutingOptions routing;  // DeepSeek-V3 shape: 256 experts, top-8, 3 + 58 layers
  routing.num_requests = 32;
  routing.min_prefill_tokens = 64;
  routing.max_prefill_tokens = 512;
  routing.decode_steps = 128;
  routing.token_repeat = 0.3;
  routing.layer_follow = 0.2;
  routing.num_task_profiles = 4;
  routing.task_variation = 0.3;
  routing.seed = 1;
  return routing;
}

Result<PlacementReport> placement_report(const PlacementReportOptions& options) {
  SyntheticRoutingOptions routing = options.routing;
  PS_ASSIGN_OR_RETURN(
      routing.popularity_skew,
      zipf_skew_for_max_over_mean(routing.num_experts, routing.top_k, options.hottest_over_mean));
  PS_ASSIGN_OR_RETURN(SyntheticRouting synthetic, generate_synthetic_routing(routing));
  PS_ASSIGN_OR_RETURN(
      ExpertRoutingLoad prefill,
      expert_load_from_routing(synthetic.requests, routing.num_experts, RoutingPhase::kPrefill));
  PS_ASSIGN_OR_RETURN(
      ExpertRoutingLoad decode,
      expert_load_from_routing(synthetic.requests, routing.num_experts, RoutingPhase::kDecode));
  PlacementReport report;
  report.moe_layers = prefill.moe_layers;
  char scenario[768];
  std::snprintf(scenario, sizeof(scenario),
                "Synthetic routing shaped like DeepSeek-V3 (%d experts, top-%d, %d MoE layers): "
                "%d requests, prompts of %d-%d tokens, %d decode steps, hottest expert %.1fx the "
                "mean (Zipf s=%.3f), adjacent-token repeat %.2f, layer follow %.2f, %d task "
                "profiles differing in %.0f%% of ranks, seed %llu. EP%d, %d redundant slot(s) "
                "per rank, EPLB with %d groups on %d nodes. Experts are placed from the "
                "batch's prefill routing and judged on its decode routing; MoE time is the "
                "busiest rank's token-expert pairs summed over layers.",
                routing.num_experts, routing.top_k, routing.num_moe_layers, routing.num_requests,
                routing.min_prefill_tokens, routing.max_prefill_tokens, routing.decode_steps,
                options.hottest_over_mean, routing.popularity_skew, routing.token_repeat,
                routing.layer_follow, routing.num_task_profiles, 100 * routing.task_variation,
                static_cast<unsigned long long>(routing.seed), options.num_ranks,
                options.redundant_per_rank, options.num_groups, options.num_nodes);
  report.scenario = scenario;

  const ExpertTimeFn cost = linear_expert_time();
  double default_time = 0.0;
  for (PlacementAlgorithm algorithm :
       {PlacementAlgorithm::kContiguous, PlacementAlgorithm::kEplbHierarchical,
        PlacementAlgorithm::kEplbGlobal, PlacementAlgorithm::kRemap, PlacementAlgorithm::kDup}) {
    PlacementOptions placement;
    placement.algorithm = algorithm;
    placement.num_ranks = options.num_ranks;
    placement.num_groups = options.num_groups;
    placement.num_nodes = options.num_nodes;
    const bool redundant =
        algorithm != PlacementAlgorithm::kContiguous && algorithm != PlacementAlgorithm::kRemap;
    placement.redundant_per_rank = redundant ? options.redundant_per_rank : 0;
    PS_ASSIGN_OR_RETURN(PlacementStudy study,
                        run_placement_study(prefill, decode, placement, cost));
    if (algorithm == PlacementAlgorithm::kContiguous) {
      default_time = study.before_evaluation.moe_time;
    }
    report.entries.push_back(entry_of(placement_algorithm_name(algorithm), study.after,
                                      study.after_evaluation, default_time));
  }
  return report;
}

}  // namespace peerserve::plan
