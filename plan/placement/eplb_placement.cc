#include "plan/placement/eplb_placement.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace peerserve::plan {
namespace {

std::vector<int> inverse(const std::vector<int>& permutation) {
  std::vector<int> inv(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) {
    inv[static_cast<size_t>(permutation[i])] = static_cast<int>(i);
  }
  return inv;
}

// rebalance_experts_hierarchical for one layer; returns physical -> logical.
std::vector<int> hierarchical_layer(const std::vector<double>& weight, int num_physical,
                                    int num_groups, int num_nodes, int num_gpus) {
  const int num_logical = static_cast<int>(weight.size());
  const int group_size = num_logical / num_groups;
  const int groups_per_node = num_groups / num_nodes;
  const int physical_per_gpu = num_physical / num_gpus;
  const int logical_per_node = num_logical / num_nodes;
  const int physical_per_node = num_physical / num_nodes;

  // Step 1: groups -> nodes. "mlog" numbers the logical experts node by node.
  std::vector<double> group_tokens(static_cast<size_t>(num_groups), 0.0);
  for (int e = 0; e < num_logical; ++e) group_tokens[e / group_size] += weight[e];
  const EplbPacking groups = eplb_balanced_packing(group_tokens, num_nodes);
  std::vector<int> log_to_mlog(static_cast<size_t>(num_logical));
  for (int e = 0; e < num_logical; ++e) {
    const int g = e / group_size;
    log_to_mlog[e] =
        (groups.pack[g] * groups_per_node + groups.rank_in_pack[g]) * group_size + e % group_size;
  }
  const std::vector<int> mlog_to_log = inverse(log_to_mlog);

  std::vector<int> physical_to_logical(static_cast<size_t>(num_physical));
  for (int node = 0; node < num_nodes; ++node) {
    // Step 2: redundant experts within the node.
    std::vector<double> node_tokens(static_cast<size_t>(logical_per_node));
    for (int i = 0; i < logical_per_node; ++i) {
      node_tokens[i] = weight[mlog_to_log[node * logical_per_node + i]];
    }
    const EplbReplication replicas = eplb_replicate_experts(node_tokens, physical_per_node);
    // Step 3: the node's physical experts -> its GPUs.
    std::vector<double> physical_tokens(static_cast<size_t>(physical_per_node));
    for (int p = 0; p < physical_per_node; ++p) {
      const int m = replicas.physical_to_logical[p];
      physical_tokens[p] = node_tokens[m] / replicas.logical_count[m];
    }
    const EplbPacking gpus = eplb_balanced_packing(physical_tokens, num_gpus / num_nodes);
    for (int p = 0; p < physical_per_node; ++p) {
      const int slot = gpus.pack[p] * physical_per_gpu + gpus.rank_in_pack[p];
      const int mlog = replicas.physical_to_logical[p] + node * logical_per_node;
      physical_to_logical[node * physical_per_node + slot] = mlog_to_log[mlog];
    }
  }
  return physical_to_logical;
}

}  // namespace

EplbPacking eplb_balanced_packing(std::span<const double> weight, int num_packs) {
  const auto n = static_cast<int>(weight.size());
  PS_CHECK(num_packs >= 1 && n % num_packs == 0) << n << " items into " << num_packs << " packs";
  const int per_pack = n / num_packs;
  EplbPacking out;
  out.pack.assign(static_cast<size_t>(n), -1);
  out.rank_in_pack.assign(static_cast<size_t>(n), 0);
  if (per_pack == 1) {
    std::iota(out.pack.begin(), out.pack.end(), 0);
    return out;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
  std::vector<double> pack_weight(static_cast<size_t>(num_packs), 0.0);
  std::vector<int> pack_items(static_cast<size_t>(num_packs), 0);
  for (int item : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
    }
    out.pack[item] = best;
    out.rank_in_pack[item] = pack_items[best]++;
    pack_weight[best] += weight[item];
  }
  return out;
}

EplbReplication eplb_replicate_experts(std::span<const double> weight, int num_physical) {
  const auto num_logical = static_cast<int>(weight.size());
  PS_CHECK(num_physical >= num_logical) << num_physical << " < " << num_logical;
  EplbReplication out;
  out.physical_to_logical.resize(static_cast<size_t>(num_physical));
  std::iota(out.physical_to_logical.begin(), out.physical_to_logical.begin() + num_logical, 0);
  out.replica_rank.assign(static_cast<size_t>(num_physical), 0);
  out.logical_count.assign(static_cast<size_t>(num_logical), 1);
  for (int p = num_logical; p < num_physical; ++p) {
    int best = 0;
    for (int e = 1; e < num_logical; ++e) {
      if (weight[e] / out.logical_count[e] > weight[best] / out.logical_count[best]) best = e;
    }
    out.physical_to_logical[p] = best;
    out.replica_rank[p] = out.logical_count[best]++;
  }
  return out;
}

std::string_view eplb_policy_name(EplbPolicy policy) {
  switch (policy) {
    case EplbPolicy::kAuto:
      return "auto";
    case EplbPolicy::kHierarchical:
      return "hierarchical";
    case EplbPolicy::kGlobal:
      return "global";
  }
  return "unknown";
}

Result<ExpertLayout> eplb_placement(const ExpertRoutingLoad& load, const EplbOptions& options) {
  PS_RETURN_IF_ERROR(load.validate());
  const int experts = load.num_experts;
  const int physical = options.num_physical_experts;
  const int gpus = options.num_gpus;
  if (gpus < 1 || physical < experts || physical % gpus != 0) {
    return invalid_argument("EPLB: " + std::to_string(physical) + " physical experts on " +
                            std::to_string(gpus) + " GPUs for " + std::to_string(experts) +
                            " experts; expected physical >= experts and a multiple of GPUs");
  }
  bool hierarchical = options.policy == EplbPolicy::kHierarchical;
  if (options.policy == EplbPolicy::kAuto) {
    hierarchical = options.num_nodes >= 1 && options.num_groups >= 1 &&
                   options.num_groups % options.num_nodes == 0;
  }
  int groups = 1;
  int nodes = 1;
  if (hierarchical) {
    groups = options.num_groups;
    nodes = options.num_nodes;
    if (groups < 1 || nodes < 1 || experts % groups != 0 || groups % nodes != 0 ||
        gpus % nodes != 0 || physical % nodes != 0) {
      return invalid_argument("EPLB hierarchical: " + std::to_string(experts) + " experts in " +
                              std::to_string(groups) + " groups on " + std::to_string(nodes) +
                              " nodes of " + std::to_string(gpus) +
                              " GPUs; expected experts divisible by groups, groups by "
                              "nodes, and GPUs by nodes");
    }
  }
  ExpertLayout placement;
  placement.num_experts = experts;
  placement.num_ranks = gpus;
  placement.slots_per_rank = physical / gpus;
  for (const auto& row : load.counts) {
    placement.physical_to_logical.push_back(hierarchical_layer(row, physical, groups, nodes, gpus));
  }
  return placement;
}

}  // namespace peerserve::plan
