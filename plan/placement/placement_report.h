// The expert-placement section of the reproduction report: load imbalance per layer and
// rank and the predicted MoE time under the default layout, EPLB, Remap and Dup, for one
// documented synthetic DeepSeek-V3-shaped scenario (the published traces are gated and
// large, and nothing in paper 004 §VI is printed per layer, so this is an illustration of
// the algorithms, not a reproduction of a printed number).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "plan/placement/placement_study.h"
#include "plan/placement/synthetic_routing.h"

namespace peerserve::plan {

struct PlacementReportOptions {
  SyntheticRoutingOptions routing = default_routing();
  double hottest_over_mean = 8.0;  // sets routing.popularity_skew
  int num_ranks = 32;              // EP32: 8 experts per rank
  int redundant_per_rank = 1;      // 288 slots, as DeepSeek-V3's 32 redundant experts
  int num_groups = 8;              // DeepSeek-V3 n_group
  int num_nodes = 4;               // 8 ranks per node

  // 32 requests, prompts of 64..512 tokens, 128 decode steps (the published traces' cap);
  // adjacent-token repeat 0.3, layer follow 0.2, 4 task profiles differing in 30% of ranks.
  static SyntheticRoutingOptions default_routing();
};

struct PlacementReportEntry {
  std::string algorithm;  // "contiguous" (the default layout), "eplb", ...
  int slots_per_rank = 0;
  std::vector<double> max_over_mean;  // per MoE layer, max/mean token-expert load over ranks
  double mean_max_over_mean = 0.0;
  double worst_max_over_mean = 0.0;
  double moe_time = 0.0;          // sum over layers of the busiest rank's token-expert pairs
  double speedup = 1.0;           // default layout's moe_time / this one's
  std::vector<double> rank_load;  // per rank, summed over layers
};

struct PlacementReport {
  std::string scenario;  // one paragraph describing the setting, for the report
  std::vector<int> moe_layers;
  std::vector<PlacementReportEntry> entries;  // contiguous first
};

// Places from the batch's prefill routing and evaluates on its decode routing (paper 004
// §VI's setting) with a linear per-token cost. Deterministic.
Result<PlacementReport> placement_report(const PlacementReportOptions& options = {});

}  // namespace peerserve::plan
