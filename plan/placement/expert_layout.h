// Where each layer's routed experts live: physical expert slots spread evenly over EP ranks,
// each holding one logical expert (an expert held by several slots is replicated, and its
// tokens are modelled as split evenly over the copies, as EPLB assumes; peerserve's dispatch
// balances per call instead, dist/expert_dispatch.h).
// Also the per-rank cost model that turns a placement and a load into MoE time.
#pragma once

#include <functional>
#include <vector>

#include "base/status.h"
#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {

struct ExpertLayout {
  int num_experts = 0;     // logical experts per layer
  int num_ranks = 0;       // EP ranks (GPUs, dies)
  int slots_per_rank = 0;  // physical experts per rank
  // [layer][slot] -> logical expert; slot s lives on rank s / slots_per_rank.
  std::vector<std::vector<int>> physical_to_logical;

  int num_layers() const { return static_cast<int>(physical_to_logical.size()); }
  int num_slots() const { return num_ranks * slots_per_rank; }
  // Copies of each logical expert at `layer`.
  std::vector<int> replica_counts(int layer) const;
  // Every layer fills all slots with ids in [0, num_experts) and places every expert at least
  // once, so the redundant slots are exactly num_slots() − num_experts per layer.
  Status validate() const;
};

// Experts [g·E/G, (g+1)·E/G) on rank g, no redundancy: the default layout of DeepSeek, Qwen
// and SGLang ("Default" in paper 004 §VI). REQUIRES-as-error: num_experts % num_ranks == 0.
Result<ExpertLayout> contiguous_layout(int num_layers, int num_experts, int num_ranks);

// Time one expert replica takes for `tokens` token-expert pairs. The planner's analytical
// model plugs its own per-token expert cost in here.
using ExpertTimeFn = std::function<double(double tokens)>;

// Time proportional to tokens: MoE time is then the max rank's token-expert load.
ExpertTimeFn linear_expert_time(double time_per_token = 1.0);

// Roofline of one expert's three GEMMs: max(compute, weight + activation traffic); an expert
// with no tokens costs nothing (grouped GEMMs skip it). All fields > 0.
struct RooflineExpertCost {
  double flops_per_token = 0.0;             // 2·3·hidden·intermediate for SwiGLU
  double weight_bytes = 0.0;                // 3·hidden·intermediate·bytes per weight
  double activation_bytes_per_token = 0.0;  // inputs in + outputs out
  double peak_flops = 0.0;                  // achieved FLOP/s
  double memory_bandwidth = 0.0;            // achieved bytes/s
};
Result<ExpertTimeFn> roofline_expert_time(const RooflineExpertCost& cost);

struct LayerBalance {
  std::vector<double> rank_load;  // token-expert pairs per rank
  double max_load = 0.0;
  double mean_load = 0.0;
  double moe_time = 0.0;  // max over ranks of the sum of its replicas' expert times
};

struct PlacementEvaluation {
  std::vector<LayerBalance> layers;
  double mean_max_over_mean = 0.0;   // average over layers of max/mean rank load
  double worst_max_over_mean = 0.0;  // worst layer
  double moe_time = 0.0;             // sum over layers (EP ranks synchronise at every layer)
};

// Loads per rank and predicted MoE time of `placement` under `load` (same layer count and
// experts). Layers with no load count as balanced (max/mean = 1).
Result<PlacementEvaluation> evaluate_placement(const ExpertRoutingLoad& load,
                                               const ExpertLayout& placement,
                                               const ExpertTimeFn& expert_time);

}  // namespace peerserve::plan
