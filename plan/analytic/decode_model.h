// Analytical decode: per-layer operator times, step time, TPOT, throughput per device and per
// package, memory per device, and the largest batch that meets a TPOT SLO.
//
// Per device (one DP rank of attention and one EP rank of the MoE) and per MoE layer, with
// B requests per device, T = B x (1 + MTP drafts) tokens and mean attended context c:
//   mla_prolog      GEMM  q_a, q_b (W_UK absorbed), kv_a                    T tokens
//   attention_core  FLOPs T x 2 x heads x (2 kv_lora + rope) x c; reads B x c x KV bytes
//   o_proj          GEMM  W_UV (absorbed), o                                 T tokens
//   gate            GEMM  hidden x routed experts (bf16)                     T tokens
//   dispatch        all-to-all of T x copies token messages
//   experts         busiest rank's tokens through its experts (see expert_load.h)
//   combine         all-to-all back
// Dense layers replace gate..combine by the dense FFN. A step runs every layer, the MTP
// module(s) (one MoE layer on B tokens each), the LM head for every token, and a fixed
// per-step cost. TPOT = step / expected tokens per request per step.
#pragma once

#include <optional>

#include "base/status.h"
#include "plan/analytic/all_to_all.h"
#include "plan/analytic/deployment.h"
#include "plan/analytic/layer_estimate.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

struct DecodeMemory {
  double weight_bytes = 0.0;  // replicated attention/dense/embeddings + held experts
  double kv_bytes = 0.0;      // B x max context x KV bytes per token (MTP layers included)
  double buffer_bytes = 0.0;  // dispatch + combine receive buffers (eq. 1-2)
  double reserved_bytes = 0.0;
  double total_bytes() const { return weight_bytes + kv_bytes + buffer_bytes + reserved_bytes; }
  double capacity_bytes = 0.0;
  bool fits() const { return total_bytes() <= capacity_bytes; }
  ExpertBuffers buffers;
};

struct DecodeEstimate {
  double batch_per_device = 0.0;
  double context_tokens = 0.0;     // mean attended KV length
  double tokens_per_device = 0.0;  // per step, B x (1 + drafts)
  LayerEstimate moe_layer;
  LayerEstimate dense_layer;
  LayerEstimate mtp_layer;  // one MTP module
  double lm_head_s = 0.0;
  double fixed_s = 0.0;
  double step_s = 0.0;
  double tokens_per_step = 1.0;  // expected output tokens per request per step
  double tpot_s = 0.0;
  double throughput_per_device = 0.0;  // output tokens/s
  double throughput_per_package = 0.0;
  double tokens_per_s_per_tflops = 0.0;  // per package, at the weight precision's peak
  DecodeMemory memory;
};

// `context_tokens`: mean KV length the batch attends; `max_context_tokens`: the KV length a
// request can reach (for memory).
Result<DecodeEstimate> estimate_decode(const ModelProfile& model, const HardwareProfile& hw,
                                       const DecodeDeployment& deployment, double batch_per_device,
                                       double context_tokens, double max_context_tokens);

struct SloBatch {
  int batch_per_device = 0;
  bool memory_bound = false;  // the next batch would not fit in memory (else: would miss SLO)
  DecodeEstimate estimate;
};

// The largest whole batch per device (1..max_batch) whose TPOT <= slo and that fits in
// memory; nullopt when even batch 1 misses.
Result<std::optional<SloBatch>> largest_batch_under_slo(
    const ModelProfile& model, const HardwareProfile& hw, const DecodeDeployment& deployment,
    double tpot_slo_s, double context_tokens, double max_context_tokens, int max_batch = 1024);

}  // namespace peerserve::plan
