#include "plan/placement/prefill_aware_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "plan/placement/eplb_placement.h"

namespace peerserve::plan {
namespace {

Status check_shape(const ExpertRoutingLoad& load, int num_ranks, const char* algorithm) {
  PS_RETURN_IF_ERROR(load.validate());
  if (num_ranks < 1 || load.num_experts % num_ranks != 0) {
    return invalid_argument(std::string(algorithm) + ": " + std::to_string(load.num_experts) +
                            " experts over " + std::to_string(num_ranks) +
                            " ranks; expected ranks >= 1 dividing the experts");
  }
  return ok_status();
}

// a < b beyond rounding noise.
bool less(double a, double b) {
  return a < b - 1e-12 * std::max(std::fabs(a), std::fabs(b));
}

std::vector<int> dup_layer(const std::vector<double>& frequency, int num_ranks, int extra,
                           const ExpertTimeFn& cost) {
  const int experts = static_cast<int>(frequency.size());
  const int home = experts / num_ranks;
  std::vector<std::vector<int>> rank_experts(static_cast<size_t>(num_ranks));
  std::vector<std::vector<int>> hosts(static_cast<size_t>(experts));
  std::vector<double> load(static_cast<size_t>(num_ranks), 0.0);
  for (int e = 0; e < experts; ++e) {
    const int g = e / home;
    rank_experts[g].push_back(e);
    hosts[e].push_back(g);
    load[g] += cost(frequency[e]);
  }
  std::vector<int> free_slots(static_cast<size_t>(num_ranks), extra);
  std::vector<int> by_load(static_cast<size_t>(num_ranks));
  for (int step = 0; step < extra * num_ranks; ++step) {
    // Ranks by decreasing load, for "the maximum over the ranks a copy leaves alone"; equal
    // loads by decreasing rank, so that the walk from the back below meets the lower rank
    // first among the least loaded.
    std::iota(by_load.begin(), by_load.end(), 0);
    std::sort(by_load.begin(), by_load.end(),
              [&](int a, int b) { return load[a] > load[b] || (load[a] == load[b] && a > b); });
    double square_sum = 0.0;
    for (double v : load) square_sum += v * v;

    double best_max = 0.0;
    double best_squares = 0.0;
    int best_expert = -1;
    int best_rank = -1;
    for (int e = 0; e < experts; ++e) {
      const auto& h = hosts[e];
      const auto copies = static_cast<double>(h.size());
      const double old_share = cost(frequency[e] / copies);
      const double new_share = cost(frequency[e] / (copies + 1.0));
      // For a fixed expert the least-loaded eligible rank is always the best target: both the
      // new maximum and the squared sum grow with the target's load.
      int target = -1;
      for (auto it = by_load.rbegin(); it != by_load.rend(); ++it) {
        if (free_slots[*it] > 0 && std::find(h.begin(), h.end(), *it) == h.end()) {
          target = *it;
          break;
        }
      }
      if (target < 0) continue;
      double new_max = load[target] + new_share;
      double squares = square_sum - load[target] * load[target] + new_max * new_max;
      for (int g : h) {
        const double updated = load[g] - old_share + new_share;
        new_max = std::max(new_max, updated);
        squares += updated * updated - load[g] * load[g];
      }
      for (int g : by_load) {
        if (g != target && std::find(h.begin(), h.end(), g) == h.end()) {
          new_max = std::max(new_max, load[g]);
          break;
        }
      }
      const bool better = best_expert < 0 || less(new_max, best_max) ||
                          (!less(best_max, new_max) && less(squares, best_squares));
      if (better) {
        best_max = new_max;
        best_squares = squares;
        best_expert = e;
        best_rank = target;
      }
    }
    PS_CHECK(best_expert >= 0) << "no rank can take a replica";
    auto& h = hosts[best_expert];
    const auto copies = static_cast<double>(h.size());
    const double old_share = cost(frequency[best_expert] / copies);
    const double new_share = cost(frequency[best_expert] / (copies + 1.0));
    for (int g : h) load[g] += new_share - old_share;
    load[best_rank] += new_share;
    h.push_back(best_rank);
    rank_experts[best_rank].push_back(best_expert);
    --free_slots[best_rank];
  }
  std::vector<int> slots;
  for (const auto& on_rank : rank_experts)
    slots.insert(slots.end(), on_rank.begin(), on_rank.end());
  return slots;
}

}  // namespace

Result<ExpertLayout> remap_placement(const ExpertRoutingLoad& load, int num_ranks,
                                     const ExpertTimeFn& cost) {
  PS_RETURN_IF_ERROR(check_shape(load, num_ranks, "Remap placement"));
  ExpertLayout placement;
  placement.num_experts = load.num_experts;
  placement.num_ranks = num_ranks;
  placement.slots_per_rank = load.num_experts / num_ranks;
  for (const auto& row : load.counts) {
    std::vector<double> costs(row.size());
    for (size_t e = 0; e < row.size(); ++e) costs[e] = cost(row[e]);
    // Algorithm 2's Remap is exactly EPLB's balanced packing applied to Cost(f).
    const EplbPacking packing = eplb_balanced_packing(costs, num_ranks);
    std::vector<int> slots(row.size());
    for (size_t e = 0; e < row.size(); ++e) {
      slots[static_cast<size_t>(packing.pack[e] * placement.slots_per_rank +
                                packing.rank_in_pack[e])] = static_cast<int>(e);
    }
    placement.physical_to_logical.push_back(std::move(slots));
  }
  return placement;
}

Result<ExpertLayout> dup_placement(const ExpertRoutingLoad& load, int num_ranks,
                                   int extra_slots_per_rank, const ExpertTimeFn& cost) {
  PS_RETURN_IF_ERROR(check_shape(load, num_ranks, "Dup placement"));
  // A rank can hold each expert once, so it has room for at most E − E/G replicas.
  const int max_extra = load.num_experts - load.num_experts / num_ranks;
  if (extra_slots_per_rank < 0 || extra_slots_per_rank > max_extra) {
    return invalid_argument(
        "Dup placement: extra slots per rank R = " + std::to_string(extra_slots_per_rank) +
        ", expected 0.." + std::to_string(max_extra) + " (one copy of an expert per rank)");
  }
  if (extra_slots_per_rank > 0 && num_ranks == 1) {
    return invalid_argument(
        "Dup placement: one rank already holds every expert; a replica "
        "needs a second rank");
  }
  ExpertLayout placement;
  placement.num_experts = load.num_experts;
  placement.num_ranks = num_ranks;
  placement.slots_per_rank = load.num_experts / num_ranks + extra_slots_per_rank;
  for (const auto& row : load.counts) {
    placement.physical_to_logical.push_back(dup_layer(row, num_ranks, extra_slots_per_rank, cost));
  }
  return placement;
}

}  // namespace peerserve::plan
