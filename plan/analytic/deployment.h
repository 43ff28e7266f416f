// How a model is deployed on a pool of devices: precisions, expert placement within one
// expert-parallel (EP) group, microbatching and MTP. One struct per phase (prefill, decode);
// both are plain values that apps/ fills from flags and the report fills per table row.
#pragma once

#include <string_view>

#include "base/status.h"
#include "plan/profiles/model_profile.h"
#include "plan/profiles/precision.h"

namespace peerserve::plan {

struct PrecisionPlan {
  Precision weights = Precision::kInt8;    // linear layers (W8A8: INT8 GEMMs)
  Precision attention = Precision::kBf16;  // attention core (QK^T, PV)
  Precision kv_cache = Precision::kBf16;
  Precision dispatch = Precision::kInt8;     // token payload sent to experts
  Precision combine = Precision::kBf16;      // expert outputs sent back
  double dispatch_scale_bytes = 512.0;       // scales/metadata per dispatched token copy
  Precision activations = Precision::kBf16;  // hidden states exchanged by attention TP
};

enum class Microbatching {
  kOff,   // operators run back to back with all resources
  kOn,    // two microbatches overlap the attention path with the MoE path
  kAuto,  // whichever of the two is faster for the given batch
};
std::string_view microbatching_name(Microbatching mode);
Result<Microbatching> parse_microbatching(std::string_view name);  // "off", "on", "auto"

// Experts of one MoE layer spread over the `devices` ranks of an EP group.
// Bounds that keep the device and slot arithmetic far from int overflow.
inline constexpr int kMaxRedundantExperts = 65536;
inline constexpr int kMaxDevices = 1 << 20;
// Batches and contexts the estimates take, in tokens (finite, and far above any deployment).
inline constexpr double kMaxEstimateTokens = 1e12;

struct ExpertPlacement {
  int devices = 1;
  int redundant_experts = 0;  // extra replicas of hot routed experts (EPLB)
  // 0: every rank holds the shared expert(s) and runs them on its own tokens (DeepSeek on
  // H800). > 0: that many ranks hold only a shared-expert copy and every token is also sent
  // to one of them (CloudMatrix decode: 32 of 320 dies).
  int shared_expert_devices = 0;
  // Max over mean routed tokens per rank; 1 is perfect EPLB.
  double expert_imbalance = 1.0;
};

struct MtpOptions {
  int draft_tokens = 0;     // speculative tokens per step (0 = MTP off)
  double acceptance = 0.0;  // probability that each draft token is accepted
  // Expected tokens emitted per request per step: 1 + p + p^2 + ... + p^draft_tokens
  // (a draft is usable only if the ones before it were accepted).
  double tokens_per_step() const;
};

struct DecodeDeployment {
  ExpertPlacement experts;  // attention is data-parallel over the same devices
  PrecisionPlan precision;
  Microbatching microbatching = Microbatching::kOn;
  MtpOptions mtp;
};

struct PrefillDeployment {
  ExpertPlacement experts;
  PrecisionPlan precision;
  Microbatching microbatching = Microbatching::kOn;
  // Attention tensor-parallel degree inside the instance (CloudMatrix's SP-TP-SP); 1 = pure
  // data parallel attention (DeepSeek on H800).
  int attention_tp = 1;
  // Scale-out traffic is sent once per destination node and forwarded inside the node
  // (DeepEP normal kernels); otherwise every token copy crosses the network.
  bool dedup_per_node = false;
  double max_tokens_per_device = 16384.0;  // prefill batch budget
};

// Checks the placement against the model: enough slots for every expert, shared-expert ranks
// leave routed ranks, the redundant experts divide evenly, imbalance >= 1, MTP acceptance
// in [0, 1]. Messages name the field and the expected range.
Status validate_placement(const ExpertPlacement& placement, const ModelProfile& model);
Status validate_decode_deployment(const DecodeDeployment& deployment, const ModelProfile& model);
Status validate_prefill_deployment(const PrefillDeployment& deployment, const ModelProfile& model);

}  // namespace peerserve::plan
