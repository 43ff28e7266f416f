#include "plan/placement/expert_routing_load.h"

#include <cmath>
#include <numeric>
#include <string>

namespace peerserve::plan {

Status ExpertRoutingLoad::validate() const {
  if (num_experts < 1) {
    return invalid_argument("expert load: num_experts = " + std::to_string(num_experts) +
                            ", expected >= 1");
  }
  if (counts.empty()) return invalid_argument("expert load: no MoE layers");
  if (moe_layers.size() != counts.size()) {
    return invalid_argument("expert load: " + std::to_string(moe_layers.size()) +
                            " layer indices for " + std::to_string(counts.size()) + " rows");
  }
  for (size_t l = 0; l < counts.size(); ++l) {
    if (counts[l].size() != static_cast<size_t>(num_experts)) {
      return invalid_argument("expert load: layer " + std::to_string(moe_layers[l]) + " has " +
                              std::to_string(counts[l].size()) + " experts, expected " +
                              std::to_string(num_experts));
    }
    for (size_t e = 0; e < counts[l].size(); ++e) {
      if (!std::isfinite(counts[l][e]) || counts[l][e] < 0.0) {
        return invalid_argument("expert load: layer " + std::to_string(moe_layers[l]) +
                                ", expert " + std::to_string(e) + " = " +
                                std::to_string(counts[l][e]) + ", expected a finite count >= 0");
      }
    }
  }
  return ok_status();
}

std::string_view routing_phase_name(RoutingPhase phase) {
  switch (phase) {
    case RoutingPhase::kPrefill:
      return "prefill";
    case RoutingPhase::kDecode:
      return "decode";
    case RoutingPhase::kAll:
      return "all";
  }
  return "unknown";
}

Result<RoutingPhase> parse_routing_phase(std::string_view name) {
  if (name == "prefill") return RoutingPhase::kPrefill;
  if (name == "decode") return RoutingPhase::kDecode;
  if (name == "all") return RoutingPhase::kAll;
  return invalid_argument("routing phase '" + std::string(name) +
                          "', expected prefill, decode or all");
}

Result<ExpertRoutingLoad> expert_load_from_routing(std::span<const RequestRouting> requests,
                                                   int num_experts, RoutingPhase phase) {
  if (requests.empty()) return invalid_argument("expert load: no requests");
  if (num_experts < 1 || num_experts > 65536) {
    return invalid_argument("expert load: num_experts = " + std::to_string(num_experts) +
                            ", expected 1..65536");
  }
  ExpertRoutingLoad load;
  load.num_experts = num_experts;
  load.moe_layers = requests.front().moe_layers;
  load.counts.assign(load.moe_layers.size(), std::vector<double>(num_experts, 0.0));
  for (size_t r = 0; r < requests.size(); ++r) {
    const RequestRouting& request = requests[r];
    if (request.moe_layers != load.moe_layers) {
      return invalid_argument("expert load: request " + std::to_string(r) +
                              " routes a different set of decoder layers than request 0");
    }
    const int first = phase == RoutingPhase::kDecode ? request.prefill_tokens : 0;
    const int last =
        phase == RoutingPhase::kPrefill ? request.prefill_tokens : request.num_tokens();
    for (size_t m = 0; m < load.moe_layers.size(); ++m) {
      for (int t = first; t < last; ++t) {
        for (uint16_t expert : request.experts(static_cast<int>(m), t)) {
          if (expert >= num_experts) {
            return invalid_argument("expert load: request " + std::to_string(r) + ", layer " +
                                    std::to_string(load.moe_layers[m]) + ": expert id " +
                                    std::to_string(expert) + " >= num_experts " +
                                    std::to_string(num_experts));
          }
          load.counts[m][expert] += 1.0;
        }
      }
    }
  }
  return load;
}

ExpertRoutingLoad scale_routing_load(const ExpertRoutingLoad& load, double total) {
  ExpertRoutingLoad scaled = load;
  for (auto& row : scaled.counts) {
    const double sum = std::accumulate(row.begin(), row.end(), 0.0);
    if (sum <= 0.0) continue;
    for (double& count : row) count *= total / sum;
  }
  return scaled;
}

}  // namespace peerserve::plan
