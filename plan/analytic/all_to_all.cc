#include "plan/analytic/all_to_all.h"

#include <algorithm>
#include <cmath>

namespace peerserve::plan {
namespace {

// C(n, k) as a double (n up to a few hundred).
double binomial(double n, double k) {
  if (k < 0.0 || k > n) return 0.0;
  return std::exp(std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0));
}

}  // namespace

AllToAllTime all_to_all_time(const HardwareProfile& hw, const AllToAllCall& call) {
  AllToAllTime t;
  const double copies = call.tokens * call.copies_per_token;
  t.payload_bytes = copies * call.bytes_per_copy;
  if (call.ranks <= 1 || copies <= 0.0) return t;
  const double efficiency = hw.efficiency.all_to_all;
  const LinkProfile& link = call.scale_out_only ? hw.scale_out : hw.link_for_group(call.ranks);
  const double remote_fraction = (call.ranks - 1.0) / call.ranks;
  if (call.dedup_per_node && !call.scale_out_only && call.ranks > hw.scale_up_domain) {
    const double scale_out_bytes = call.tokens * call.remote_nodes_per_token * call.bytes_per_copy;
    const double scale_up_bytes = t.payload_bytes * remote_fraction;
    t.network_bytes = scale_out_bytes;
    t.transfer_s = std::max(scale_out_bytes / (hw.scale_out.bandwidth_gb_s * 1e9 * efficiency),
                            scale_up_bytes / (hw.scale_up.bandwidth_gb_s * 1e9 * efficiency));
  } else {
    t.network_bytes = t.payload_bytes * remote_fraction;
    t.transfer_s = t.network_bytes / (link.bandwidth_gb_s * 1e9 * efficiency);
  }
  t.message_s = call.copy_engine ? 0.0 : copies * hw.fixed.all_to_all_per_token_copy_ns * 1e-9;
  t.fixed_s = (hw.fixed.all_to_all_us +
               hw.fixed.all_to_all_per_log2_rank_us * std::log2(static_cast<double>(call.ranks)) +
               link.latency_us) *
              1e-6;
  t.seconds = t.fixed_s + std::max(t.transfer_s, t.message_s);
  return t;
}

double dispatch_bytes_per_copy(const ModelProfile& model, const PrecisionPlan& precision) {
  return model.hidden_size * bytes_per_element(precision.dispatch) + precision.dispatch_scale_bytes;
}

double combine_bytes_per_copy(const ModelProfile& model, const PrecisionPlan& precision) {
  return model.hidden_size * bytes_per_element(precision.combine);
}

double expected_remote_nodes_per_token(const ModelProfile& model, int devices,
                                       int devices_per_node) {
  const int per_node = std::max(1, devices_per_node);
  const int nodes = (devices + per_node - 1) / per_node;
  if (nodes <= 1) return 0.0;
  double untouched = 0.0;  // probability that a given node holds none of the token's experts
  const int groups = model.num_expert_groups;
  if (groups >= nodes && groups % nodes == 0 && model.topk_groups < groups) {
    const double groups_per_node = static_cast<double>(groups) / nodes;
    untouched =
        binomial(groups - groups_per_node, model.topk_groups) / binomial(groups, model.topk_groups);
  } else {
    const double experts = model.num_routed_experts;
    const double per = experts / nodes;
    untouched = binomial(experts - per, model.experts_per_token) /
                binomial(experts, model.experts_per_token);
  }
  return (nodes - 1.0) * (1.0 - untouched);
}

ExpertBuffers expert_buffers(int ranks, double local_batch, int top_k, int experts_per_device,
                             double dispatch_message_bytes, double combine_message_bytes) {
  ExpertBuffers b;
  b.max_tokens = local_batch * std::min(top_k, experts_per_device);
  b.dispatch_bytes = ranks * b.max_tokens * dispatch_message_bytes;
  b.combine_bytes = ranks * b.max_tokens * combine_message_bytes;
  return b;
}

}  // namespace peerserve::plan
