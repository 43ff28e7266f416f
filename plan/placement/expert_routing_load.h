// Per-layer expert load: how many token-expert selections each routed expert received.
// The input of every placement algorithm and of the per-rank cost model.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/placement/routing_trace.h"

namespace peerserve::plan {

struct ExpertRoutingLoad {
  int num_experts = 0;
  std::vector<int> moe_layers;              // decoder-layer index of each row
  std::vector<std::vector<double>> counts;  // [layer][expert] token-expert selections

  int num_layers() const { return static_cast<int>(counts.size()); }
  // Every row has num_experts finite, non-negative entries and one decoder index.
  Status validate() const;
};

enum class RoutingPhase { kPrefill, kDecode, kAll };
std::string_view routing_phase_name(RoutingPhase phase);
Result<RoutingPhase> parse_routing_phase(std::string_view name);  // "prefill", "decode", "all"

// Sums the selections of `phase` over `requests`, which must share one MoE-layer layout.
Result<ExpertRoutingLoad> expert_load_from_routing(std::span<const RequestRouting> requests,
                                                   int num_experts, RoutingPhase phase);

// `load` with every layer rescaled to sum to `total` (e.g. decode batch × top-k), keeping the
// shares; all-zero layers stay zero. Placement with a non-linear cost needs loads in the units
// of one step, not of a whole trace.
ExpertRoutingLoad scale_routing_load(const ExpertRoutingLoad& load, double total);

}  // namespace peerserve::plan
