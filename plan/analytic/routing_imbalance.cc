#include "plan/analytic/routing_imbalance.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <string>
#include <vector>

#include "plan/placement/synthetic_routing.h"
#include "plan/sim/workload.h"

namespace peerserve::plan {
namespace {

// One layer: replicate, pack, and return max / mean load over the routed ranks.
double layer_max_over_mean(const std::vector<double>& counts, int redundant, int ranks,
                           int slots_per_rank) {
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  if (total <= 0.0) return 1.0;
  const int experts = static_cast<int>(counts.size());
  std::vector<int> replicas(experts, 1);
  // Redundant replicas to the expert with the highest load per replica.
  auto per_replica = [&](int e) { return counts[e] / replicas[e]; };
  std::priority_queue<std::pair<double, int>> hottest;
  for (int e = 0; e < experts; ++e) hottest.push({per_replica(e), -e});
  for (int r = 0; r < redundant; ++r) {
    const int e = -hottest.top().second;
    hottest.pop();
    ++replicas[e];
    hottest.push({per_replica(e), -e});
  }
  // Pack replicas heaviest first onto the least-loaded rank with a free slot.
  std::vector<std::pair<double, int>> items;
  for (int e = 0; e < experts; ++e) {
    for (int c = 0; c < replicas[e]; ++c) items.push_back({per_replica(e), e});
  }
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<double> load(ranks, 0.0);
  std::vector<int> used(ranks, 0);
  for (const auto& [weight, expert] : items) {
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (used[r] < slots_per_rank && (best < 0 || load[r] < load[best])) best = r;
    }
    load[best] += weight;
    ++used[best];
  }
  const double mean = total / ranks;
  return *std::max_element(load.begin(), load.end()) / mean;
}

}  // namespace

Result<RoutingImbalance> routing_imbalance(const ExpertRoutingLoad& load, const ModelProfile& model,
                                           const ExpertPlacement& placement) {
  PS_RETURN_IF_ERROR(validate_placement(placement, model));
  PS_RETURN_IF_ERROR(load.validate());
  if (load.num_experts != model.num_routed_experts) {
    return invalid_argument("routing load has " + std::to_string(load.num_experts) +
                            " experts per layer, model '" + model.name + "' has " +
                            std::to_string(model.num_routed_experts));
  }
  if (load.num_layers() == 0) return invalid_argument("routing load has no MoE layers");
  const int ranks = placement.devices - placement.shared_expert_devices;
  const int slots = (model.num_routed_experts + placement.redundant_experts) / ranks;
  RoutingImbalance result;
  result.worst_max_over_mean = 0.0;
  double sum = 0.0;
  for (const auto& counts : load.counts) {
    const double m = layer_max_over_mean(counts, placement.redundant_experts, ranks, slots);
    sum += m;
    result.worst_max_over_mean = std::max(result.worst_max_over_mean, m);
  }
  result.mean_max_over_mean = sum / load.num_layers();
  return result;
}

Result<ExpertRoutingLoad> skewed_routing_load(const ModelProfile& model, double hottest_over_mean,
                                              double tokens_per_layer, uint64_t seed) {
  if (!(tokens_per_layer > 0.0)) return invalid_argument("tokens_per_layer must be > 0");
  const int experts = model.num_routed_experts;
  const int top_k = model.experts_per_token;
  double skew = 0.0;
  if (hottest_over_mean > 1.0) {
    PS_ASSIGN_OR_RETURN(skew, zipf_skew_for_max_over_mean(experts, top_k, hottest_over_mean));
  } else if (hottest_over_mean < 1.0) {
    return invalid_argument("hottest expert over mean must be >= 1 (1 = uniform routing)");
  }
  const std::vector<double> inclusion = zipf_inclusion_probabilities(experts, top_k, skew);
  ExpertRoutingLoad load;
  load.num_experts = experts;
  DeterministicRandom rng(seed);
  const double tokens = tokens_per_layer / top_k;  // tokens, each choosing top_k experts
  for (int layer = 0; layer < model.num_moe_layers(); ++layer) {
    load.moe_layers.push_back(model.num_dense_layers + layer);
    std::vector<int> order(experts);
    std::iota(order.begin(), order.end(), 0);
    for (int i = experts - 1; i > 0; --i) {  // Fisher-Yates with the deterministic stream
      std::swap(order[i], order[static_cast<int>(rng.uniform() * (i + 1))]);
    }
    std::vector<double> counts(experts, 0.0);
    for (int rank = 0; rank < experts; ++rank) counts[order[rank]] = inclusion[rank] * tokens;
    load.counts.push_back(std::move(counts));
  }
  return load;
}

}  // namespace peerserve::plan
