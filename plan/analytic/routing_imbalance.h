// From an expert-routing distribution to the cost model's expert_imbalance: the max over mean
// routed tokens per EP rank once the deployment's redundant experts are placed EPLB-style
// (the global policy of DeepSeek's eplb.py: each redundant replica goes to the expert with the
// highest load per replica, then replicas are packed onto ranks heaviest first, each to the
// least-loaded rank with a free slot). Routing comes from traces (plan/placement's reader),
// from a synthetic skewed distribution, or is uniform (imbalance 1).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "plan/analytic/deployment.h"
#include "plan/placement/expert_routing_load.h"
#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

struct RoutingImbalance {
  double mean_max_over_mean = 1.0;   // averaged over MoE layers: what the cost model uses
  double worst_max_over_mean = 1.0;  // the worst layer
};

// `load` must have the model's routed experts; layers with no tokens count as balanced.
Result<RoutingImbalance> routing_imbalance(const ExpertRoutingLoad& load, const ModelProfile& model,
                                           const ExpertPlacement& placement);

// A routing load whose hottest expert is chosen `hottest_over_mean` times as often as the
// average one (Zipf popularity, a fresh random ranking per layer; 1 = uniform), with
// `tokens_per_layer` token-expert selections per layer. Deterministic for a seed.
Result<ExpertRoutingLoad> skewed_routing_load(const ModelProfile& model, double hottest_over_mean,
                                              double tokens_per_layer, uint64_t seed);

}  // namespace peerserve::plan
