#include "plan/placement/expert_layout.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace peerserve::plan {

std::vector<int> ExpertLayout::replica_counts(int layer) const {
  std::vector<int> counts(static_cast<size_t>(num_experts), 0);
  for (int expert : physical_to_logical[static_cast<size_t>(layer)]) {
    ++counts[static_cast<size_t>(expert)];
  }
  return counts;
}

Status ExpertLayout::validate() const {
  if (num_experts < 1 || num_ranks < 1 || slots_per_rank < 1) {
    return invalid_argument("expert layout: experts " + std::to_string(num_experts) + ", ranks " +
                            std::to_string(num_ranks) + ", slots per rank " +
                            std::to_string(slots_per_rank) + "; expected all >= 1");
  }
  if (num_slots() < num_experts) {
    return invalid_argument("expert layout: " + std::to_string(num_slots()) +
                            " slots cannot hold " + std::to_string(num_experts) + " experts");
  }
  for (size_t l = 0; l < physical_to_logical.size(); ++l) {
    const auto& slots = physical_to_logical[l];
    if (slots.size() != static_cast<size_t>(num_slots())) {
      return invalid_argument("expert layout: layer " + std::to_string(l) + " has " +
                              std::to_string(slots.size()) + " slots, expected " +
                              std::to_string(num_slots()));
    }
    std::vector<bool> seen(static_cast<size_t>(num_experts), false);
    for (int expert : slots) {
      if (expert < 0 || expert >= num_experts) {
        return invalid_argument("expert layout: layer " + std::to_string(l) + " holds expert " +
                                std::to_string(expert) + ", expected [0, " +
                                std::to_string(num_experts) + ")");
      }
      seen[static_cast<size_t>(expert)] = true;
    }
    const auto missing = std::find(seen.begin(), seen.end(), false);
    if (missing != seen.end()) {
      return invalid_argument("expert layout: layer " + std::to_string(l) +
                              " never places expert " + std::to_string(missing - seen.begin()));
    }
  }
  return ok_status();
}

Result<ExpertLayout> contiguous_layout(int num_layers, int num_experts, int num_ranks) {
  if (num_layers < 1 || num_experts < 1 || num_ranks < 1 || num_experts % num_ranks != 0) {
    return invalid_argument("contiguous layout: " + std::to_string(num_experts) + " experts over " +
                            std::to_string(num_ranks) + " ranks (" + std::to_string(num_layers) +
                            " layers); expected experts divisible by ranks, all >= 1");
  }
  ExpertLayout placement;
  placement.num_experts = num_experts;
  placement.num_ranks = num_ranks;
  placement.slots_per_rank = num_experts / num_ranks;
  std::vector<int> identity(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) identity[static_cast<size_t>(e)] = e;
  placement.physical_to_logical.assign(static_cast<size_t>(num_layers), identity);
  return placement;
}

ExpertTimeFn linear_expert_time(double time_per_token) {
  return [time_per_token](double tokens) { return time_per_token * tokens; };
}

Result<ExpertTimeFn> roofline_expert_time(const RooflineExpertCost& cost) {
  for (double value : {cost.flops_per_token, cost.weight_bytes, cost.activation_bytes_per_token,
                       cost.peak_flops, cost.memory_bandwidth}) {
    if (!std::isfinite(value) || value <= 0.0) {
      return invalid_argument("roofline expert cost: every field must be finite and > 0, got " +
                              std::to_string(value));
    }
  }
  return ExpertTimeFn([cost](double tokens) {
    if (tokens <= 0.0) return 0.0;
    const double compute = cost.flops_per_token * tokens / cost.peak_flops;
    const double memory =
        (cost.weight_bytes + cost.activation_bytes_per_token * tokens) / cost.memory_bandwidth;
    return std::max(compute, memory);
  });
}

Result<PlacementEvaluation> evaluate_placement(const ExpertRoutingLoad& load,
                                               const ExpertLayout& placement,
                                               const ExpertTimeFn& expert_time) {
  PS_RETURN_IF_ERROR(load.validate());
  PS_RETURN_IF_ERROR(placement.validate());
  if (load.num_layers() != placement.num_layers() || load.num_experts != placement.num_experts) {
    return invalid_argument("placement evaluation: load has " + std::to_string(load.num_layers()) +
                            " layers x " + std::to_string(load.num_experts) +
                            " experts, placement " + std::to_string(placement.num_layers()) +
                            " x " + std::to_string(placement.num_experts));
  }
  PlacementEvaluation out;
  for (int l = 0; l < load.num_layers(); ++l) {
    const std::vector<int> replicas = placement.replica_counts(l);
    const auto& counts = load.counts[static_cast<size_t>(l)];
    LayerBalance layer;
    layer.rank_load.assign(static_cast<size_t>(placement.num_ranks), 0.0);
    std::vector<double> rank_time(static_cast<size_t>(placement.num_ranks), 0.0);
    const auto& slots = placement.physical_to_logical[static_cast<size_t>(l)];
    for (size_t s = 0; s < slots.size(); ++s) {
      const auto expert = static_cast<size_t>(slots[s]);
      const double tokens = counts[expert] / replicas[expert];
      const size_t rank = s / static_cast<size_t>(placement.slots_per_rank);
      layer.rank_load[rank] += tokens;
      rank_time[rank] += expert_time(tokens);
    }
    layer.max_load = *std::max_element(layer.rank_load.begin(), layer.rank_load.end());
    double sum = 0.0;
    for (double v : layer.rank_load) sum += v;
    layer.mean_load = sum / placement.num_ranks;
    layer.moe_time = *std::max_element(rank_time.begin(), rank_time.end());
    const double ratio = layer.mean_load > 0.0 ? layer.max_load / layer.mean_load : 1.0;
    out.mean_max_over_mean += ratio / load.num_layers();
    out.worst_max_over_mean = std::max(out.worst_max_over_mean, ratio);
    out.moe_time += layer.moe_time;
    out.layers.push_back(std::move(layer));
  }
  return out;
}

}  // namespace peerserve::plan
