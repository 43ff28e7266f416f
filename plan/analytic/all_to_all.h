// MoE dispatch and combine between the ranks of an EP group, and the receive buffers that
// the fused operators pre-allocate for them (paper 000 §4.2.1, eq. 1-2).
#pragma once

#include "plan/analytic/deployment.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

struct AllToAllCall {
  int ranks = 1;                  // EP degree
  double tokens = 0.0;            // tokens a rank sends out
  double copies_per_token = 0.0;  // destinations per token (routed top-k, + shared if remote)
  double bytes_per_copy = 0.0;
  // Hierarchical mode: each token crosses the scale-out network once per remote destination
  // node (remote_nodes_per_token of them) and is forwarded over scale-up inside the node.
  bool dedup_per_node = false;
  double remote_nodes_per_token = 0.0;
  // Every copy goes over scale-out even inside a scale-up domain (DeepEP low-latency kernels
  // use RDMA only).
  bool scale_out_only = false;
  // Bulk transfers on copy engines (SDMA; prefill): no per-message work on the compute cores,
  // so message_s is 0. Decode's low-latency path issues every message from the cores.
  bool copy_engine = false;
};

struct AllToAllTime {
  double seconds = 0.0;
  double payload_bytes = 0.0;  // tokens x copies x bytes_per_copy (what benchmarks divide by)
  double network_bytes = 0.0;  // bytes that leave the rank on the binding link
  double transfer_s = 0.0;     // network_bytes / (bandwidth x efficiency.all_to_all)
  // copies x all_to_all_per_token_copy_ns: packing, quantising and issuing each message on the
  // device's own cores (AIV-direct on Ascend), so it slows down with a smaller core share.
  double message_s = 0.0;
  double fixed_s = 0.0;  // fixed + per-log2-rank synchronisation + link latency
  double link_s() const { return fixed_s + transfer_s; }
};

// seconds = fixed_s + max(transfer_s, message_s): packing a message overlaps with sending the
// previous ones (paper 000 §4.2.1's data-sending pipeline). Without dedup the copies go uniformly
// to all ranks, (ranks - 1) / ranks of them remote, over the scale-up link when the group fits one
// scale-up domain and over scale-out otherwise.
AllToAllTime all_to_all_time(const HardwareProfile& hw, const AllToAllCall& call);

// Bytes of one dispatched token copy: hidden x dispatch precision + scale/metadata bytes;
// of one combined copy: hidden x combine precision.
double dispatch_bytes_per_copy(const ModelProfile& model, const PrecisionPlan& precision);
double combine_bytes_per_copy(const ModelProfile& model, const PrecisionPlan& precision);

// Expected number of nodes other than the sender's that hold a token's routed experts, with
// experts spread evenly over `devices` ranks in nodes of `devices_per_node`; group-limited
// routing (top-k groups out of G, whole groups per node) is used when groups map onto nodes.
double expected_remote_nodes_per_token(const ModelProfile& model, int devices,
                                       int devices_per_node);

// Paper 000 eq. 1-2: buffer = ranks x max_tokens x message size with
// max_tokens = local_batch x min(top-k, experts per device).
struct ExpertBuffers {
  double max_tokens = 0.0;
  double dispatch_bytes = 0.0;
  double combine_bytes = 0.0;
  double total_bytes() const { return dispatch_bytes + combine_bytes; }
};
ExpertBuffers expert_buffers(int ranks, double local_batch, int top_k, int experts_per_device,
                             double dispatch_message_bytes, double combine_message_bytes);

}  // namespace peerserve::plan
