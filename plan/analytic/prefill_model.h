// Analytical prefill of one batch on one prefill instance (an EP group of `devices`), per
// device and per layer, with context-cache hits:
//   mla_down        GEMM  q_a, kv_a                          on new tokens
//   tp_all_gather   (attention TP > 1) compressed q, kv of new tokens and kv latents of cached
//                   tokens from the other TP ranks
//   mla_up          GEMM  q_b, kv_b on new tokens; kv_b on cached tokens (plain MHA form)
//   attention_core  FLOPs sum over new tokens of 2 x heads x (qk + v dims) x causal context
//   tp_all_to_all   (attention TP > 1) head shards back to sequence shards
//   o_proj          GEMM  o                                  on new tokens
//   gate, dispatch, experts, combine as in decode (dense layers: dense_ffn)
// plus, per batch, loading the cached tokens' KV from the caching pool and a fixed cost.
// Operators run at the decode-kernel rates x efficiency.prefill; layers are microbatched or
// sequential as in layer_estimate.h.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "plan/analytic/deployment.h"
#include "plan/analytic/layer_estimate.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

// Work of one prefill batch, per device of the instance.
struct PrefillBatch {
  double new_tokens = 0.0;     // tokens computed (prompt minus cache hits)
  double cached_tokens = 0.0;  // tokens whose KV comes from the caching pool
  // Sum over the new tokens of the context each attends (causal: position + 1).
  double attended_context = 0.0;
};

// `requests_per_device` requests of `prompt_tokens` each, of which the first
// `reuse_fraction` x prompt tokens are cache hits.
PrefillBatch uniform_prefill_batch(double requests_per_device, double prompt_tokens,
                                   double reuse_fraction);

struct PrefillEstimate {
  PrefillBatch batch;
  LayerEstimate moe_layer;
  LayerEstimate dense_layer;
  double cache_load_s = 0.0;  // cached KV from the pool, per batch
  double fixed_s = 0.0;
  double batch_s = 0.0;  // time to prefill the batch = TTFT of its requests
  // Prompt tokens (new + cached) per second.
  double throughput_per_device = 0.0;
  double throughput_per_package = 0.0;
  double tokens_per_s_per_tflops = 0.0;  // per package, at the weight precision's peak
};

// `memory_pool_path`: which caching-pool path of the hardware serves cache hits ("ub",
// "vpc"); ignored when the batch has no cached tokens.
Result<PrefillEstimate> estimate_prefill(const ModelProfile& model, const HardwareProfile& hw,
                                         const PrefillDeployment& deployment,
                                         const PrefillBatch& batch,
                                         const std::string& memory_pool_path = "ub");

}  // namespace peerserve::plan
