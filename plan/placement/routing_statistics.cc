#include "plan/placement/routing_statistics.h"

#include <algorithm>
#include <numeric>

#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {
namespace {

std::vector<int> top_experts(const std::vector<double>& counts, size_t n) {
  std::vector<int> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return counts[a] > counts[b]; });
  order.resize(std::min(n, order.size()));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

Result<RoutingStatistics> routing_statistics(std::span<const RequestRouting> requests,
                                             int num_experts) {
  PS_ASSIGN_OR_RETURN(ExpertRoutingLoad all,
                      expert_load_from_routing(requests, num_experts, RoutingPhase::kAll));
  RoutingStatistics stats;
  for (const auto& row : all.counts) {
    const double sum = std::accumulate(row.begin(), row.end(), 0.0);
    const double max = *std::max_element(row.begin(), row.end());
    stats.max_over_mean.push_back(sum > 0.0 ? max * num_experts / sum : 0.0);
  }

  double overlap_sum = 0.0;
  int64_t pairs = 0;
  for (const RequestRouting& request : requests) {
    for (int m = 0; m < static_cast<int>(request.moe_layers.size()); ++m) {
      for (int t = 1; t < request.num_tokens(); ++t) {
        const auto now = request.experts(m, t);
        const auto before = request.experts(m, t - 1);
        int common = 0;
        for (uint16_t e : now) common += std::find(before.begin(), before.end(), e) != before.end();
        overlap_sum += static_cast<double>(common) / request.top_k;
        ++pairs;
      }
    }
  }
  stats.token_repeat_fraction = pairs > 0 ? overlap_sum / static_cast<double>(pairs) : 0.0;

  const bool has_decode = std::any_of(requests.begin(), requests.end(),
                                      [](const RequestRouting& r) { return r.decode_steps > 0; });
  if (has_decode) {
    PS_ASSIGN_OR_RETURN(ExpertRoutingLoad prefill,
                        expert_load_from_routing(requests, num_experts, RoutingPhase::kPrefill));
    PS_ASSIGN_OR_RETURN(ExpertRoutingLoad decode,
                        expert_load_from_routing(requests, num_experts, RoutingPhase::kDecode));
    for (size_t n : {5u, 10u, 20u}) {
      double sum = 0.0;
      for (size_t l = 0; l < prefill.counts.size(); ++l) {
        const auto a = top_experts(prefill.counts[l], n);
        const auto b = top_experts(decode.counts[l], n);
        std::vector<int> common;
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
        sum += static_cast<double>(common.size()) / static_cast<double>(a.size());
      }
      stats.prefill_decode_top_overlap.push_back(sum / static_cast<double>(prefill.counts.size()));
    }
  }
  return stats;
}

}  // namespace peerserve::plan
