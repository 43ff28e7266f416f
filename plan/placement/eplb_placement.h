// Redundant-expert placement as DeepSeek's EPLB (github.com/deepseek-ai/EPLB, eplb.py) does
// it, layer by layer:
//   hierarchical (num_groups % num_nodes == 0): pack expert groups onto nodes so that node
//     loads balance, replicate the hottest experts within each node, then pack the node's
//     physical experts onto its GPUs;
//   global (otherwise): replicate over all experts, then pack onto all GPUs.
// "Replicate" repeatedly adds a copy of the expert with the largest load per copy; "pack" is
// greedy longest-first onto the least-loaded bin that still has room (equal items per bin).
// Ties go to the lower index, where the reference relies on torch's sort/argmax order.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/placement/expert_layout.h"
#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {

struct EplbPacking {
  std::vector<int> pack;          // bin of each item
  std::vector<int> rank_in_pack;  // position of the item within its bin
};
// REQUIRES: weight.size() % num_packs == 0 (each bin takes exactly size/num_packs items).
EplbPacking eplb_balanced_packing(std::span<const double> weight, int num_packs);

struct EplbReplication {
  std::vector<int> physical_to_logical;  // first num_logical entries are the identity
  std::vector<int> replica_rank;         // 0 for the original, 1.. for added copies
  std::vector<int> logical_count;        // copies of each logical expert
};
// REQUIRES: num_physical >= weight.size().
EplbReplication eplb_replicate_experts(std::span<const double> weight, int num_physical);

enum class EplbPolicy {
  kAuto,  // hierarchical when num_groups % num_nodes == 0, as rebalance_experts does
  kHierarchical,
  kGlobal,
};
std::string_view eplb_policy_name(EplbPolicy policy);

struct EplbOptions {
  int num_physical_experts = 0;  // slots per layer over all GPUs (experts + redundant)
  int num_groups = 1;            // expert groups (DeepSeek-V3: 8 groups of 32)
  int num_nodes = 1;             // nodes with a fast intra-node network
  int num_gpus = 1;              // EP ranks; a multiple of num_nodes
  EplbPolicy policy = EplbPolicy::kAuto;
};

// One placement per layer of `load`, balancing its counts. Errors name the divisibility
// condition that failed.
Result<ExpertLayout> eplb_placement(const ExpertRoutingLoad& load, const EplbOptions& options);

}  // namespace peerserve::plan
