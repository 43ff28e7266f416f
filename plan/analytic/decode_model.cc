#include "plan/analytic/decode_model.h"

#include <cmath>

#include "plan/analytic/device_rates.h"
#include "plan/analytic/expert_load.h"

namespace peerserve::plan {
namespace {

// Everything one decode layer evaluation needs, resolved once per estimate.
struct DecodeContext {
  const ModelProfile& model;
  const HardwareProfile& hw;
  const DecodeDeployment& deployment;
  DeviceRates rates;
  double weight_bytes = 1.0;
  double kv_bytes = 2.0;
  double dispatch_bytes = 0.0;
  double combine_bytes = 0.0;
};

std::vector<OperatorTime> layer_operators(const DecodeContext& cx, double tokens, double requests,
                                          double context, bool moe) {
  const ModelProfile& m = cx.model;
  std::vector<OperatorTime> ops;
  const auto attention = OperatorStream::kAttention;
  const auto moe_stream = OperatorStream::kMoe;
  auto compute = [&ops](const char* name, OperatorStream stream, double seconds) {
    OperatorTime op;
    op.name = name;
    op.stream = stream;
    op.compute_s = seconds;
    ops.push_back(op);
  };
  compute("mla_prolog", attention,
          gemm_seconds(cx.rates, attention_weights_before_core(m), tokens, cx.weight_bytes));
  const double core_flops = tokens * attention_core_flops_decode(m, context);
  const double core_bytes = requests * context * kv_elements_per_token_per_layer(m) * cx.kv_bytes;
  compute("attention_core", attention, attention_seconds(cx.rates, core_flops, core_bytes));
  compute("o_proj", attention,
          gemm_seconds(cx.rates, attention_weights_after_core(m), tokens, cx.weight_bytes));
  if (!moe) {
    compute("dense_ffn", moe_stream,
            gemm_seconds(cx.rates, dense_ffn_weights(m), tokens, cx.weight_bytes));
    return ops;
  }
  const ExpertPlacement& placement = cx.deployment.experts;
  const ExpertLoad load = expert_load(m, placement, tokens);
  compute("gate", moe_stream,
          gemm_seconds(cx.rates, gate_weights(m), tokens, bytes_per_element(Precision::kBf16)));
  AllToAllCall call;
  call.ranks = placement.devices;
  call.tokens = tokens;
  call.copies_per_token = load.copies_per_token;
  auto exchange = [&](const char* name, double bytes_per_copy) {
    call.bytes_per_copy = bytes_per_copy;
    const AllToAllTime t = all_to_all_time(cx.hw, call);
    OperatorTime op;
    op.name = name;
    op.stream = moe_stream;
    op.compute_s = t.message_s;
    op.link_s = t.transfer_s;
    op.fixed_s = t.fixed_s;
    ops.push_back(op);
  };
  exchange("dispatch", cx.dispatch_bytes);
  compute("experts", moe_stream, expert_seconds(m, load, cx.rates, cx.weight_bytes));
  exchange("combine", cx.combine_bytes);
  return ops;
}

LayerEstimate estimate_layer(const DecodeContext& cx, double tokens, double requests,
                             double context, bool moe) {
  return layer_estimate(layer_operators(cx, tokens, requests, context, moe),
                        layer_operators(cx, tokens / 2.0, requests / 2.0, context, moe),
                        cx.deployment.microbatching, PipelineKind::kPartitionedCores);
}

DecodeMemory decode_memory(const DecodeContext& cx, double batch, double tokens,
                           double max_context) {
  const ModelProfile& m = cx.model;
  const ExpertPlacement& placement = cx.deployment.experts;
  const ExpertLoad load = expert_load(m, placement, tokens);
  const double w = cx.weight_bytes;
  const double moe_layers = m.num_moe_layers() + m.num_mtp_layers;
  DecodeMemory mem;
  mem.weight_bytes = (m.num_layers + m.num_mtp_layers) * attention_weights_per_layer(m) * w +
                     m.num_dense_layers * dense_ffn_weights(m) * w +
                     2.0 * embedding_weights(m) * w +
                     moe_layers * (load.experts_per_routed_device * expert_weights(m) * w +
                                   gate_weights(m) * bytes_per_element(Precision::kBf16));
  mem.kv_bytes = batch * max_context * kv_elements_per_token_per_layer(m) * cx.kv_bytes *
                 (m.num_layers + m.num_mtp_layers);
  // Sized by the die's whole local batch, as paper 000 sizes them (96 tokens: 225 MB dispatch):
  // with two microbatches in flight each has its half, which adds up to the same.
  mem.buffers = expert_buffers(placement.devices, std::ceil(tokens), m.experts_per_token,
                               static_cast<int>(std::ceil(load.slots_per_routed_device)),
                               cx.dispatch_bytes, cx.combine_bytes);
  mem.buffer_bytes = mem.buffers.total_bytes();
  mem.reserved_bytes = cx.hw.reserved_memory_gb * 1e9;
  mem.capacity_bytes = cx.hw.hbm_capacity_gb * 1e9;
  return mem;
}

}  // namespace

Result<DecodeEstimate> estimate_decode(const ModelProfile& model, const HardwareProfile& hw,
                                       const DecodeDeployment& deployment, double batch_per_device,
                                       double context_tokens, double max_context_tokens) {
  PS_RETURN_IF_ERROR(validate_decode_deployment(deployment, model));
  if (deployment.mtp.draft_tokens > 0 && model.num_mtp_layers == 0) {
    return invalid_argument("model '" + model.name +
                            "' has no MTP module: " + std::to_string(deployment.mtp.draft_tokens) +
                            " MTP drafts per step cannot run");
  }
  if (!(batch_per_device > 0.0) || !(batch_per_device <= kMaxEstimateTokens)) {
    return invalid_argument("decode batch per device must be > 0 and finite (at most 1e12)");
  }
  if (!(context_tokens >= 0.0) || !(max_context_tokens >= context_tokens) ||
      !(max_context_tokens <= kMaxEstimateTokens)) {
    return invalid_argument(
        "decode context must satisfy 0 <= mean context <= max context <= 1e12 tokens");
  }
  PS_ASSIGN_OR_RETURN(DeviceRates rates, device_rates(hw, deployment.precision, false));
  DecodeContext cx{model, hw, deployment, rates};
  cx.weight_bytes = bytes_per_element(deployment.precision.weights);
  cx.kv_bytes = bytes_per_element(deployment.precision.kv_cache);
  cx.dispatch_bytes = dispatch_bytes_per_copy(model, deployment.precision);
  cx.combine_bytes = combine_bytes_per_copy(model, deployment.precision);

  DecodeEstimate e;
  e.batch_per_device = batch_per_device;
  e.context_tokens = context_tokens;
  const int drafts = deployment.mtp.draft_tokens;
  e.tokens_per_device = batch_per_device * (1.0 + drafts);
  e.moe_layer = estimate_layer(cx, e.tokens_per_device, batch_per_device, context_tokens, true);
  e.dense_layer = estimate_layer(cx, e.tokens_per_device, batch_per_device, context_tokens, false);
  double step =
      model.num_moe_layers() * e.moe_layer.seconds + model.num_dense_layers * e.dense_layer.seconds;
  if (drafts > 0) {
    // Each draft token runs one MTP module on one token per request (one module drafting
    // autoregressively, or module i for draft i: one pass per draft either way).
    e.mtp_layer = estimate_layer(cx, batch_per_device, batch_per_device, context_tokens, true);
    step += drafts * e.mtp_layer.seconds;
  }
  // LM head: main model on every token, and once per draft for the MTP module.
  e.lm_head_s =
      gemm_seconds(rates, embedding_weights(model), e.tokens_per_device, cx.weight_bytes) +
      drafts * gemm_seconds(rates, embedding_weights(model), batch_per_device, cx.weight_bytes);
  e.fixed_s = hw.fixed.decode_step_ms * 1e-3;
  e.step_s = step + e.lm_head_s + e.fixed_s;
  e.tokens_per_step = deployment.mtp.tokens_per_step();
  e.tpot_s = e.step_s / e.tokens_per_step;
  e.throughput_per_device = batch_per_device / e.tpot_s;
  e.throughput_per_package = e.throughput_per_device * hw.devices_per_package;
  PS_ASSIGN_OR_RETURN(const double peak, hw.peak_flops(deployment.precision.weights));
  e.tokens_per_s_per_tflops = e.throughput_per_device / (peak / 1e12);
  e.memory = decode_memory(cx, batch_per_device, e.tokens_per_device, max_context_tokens);
  if (!std::isfinite(e.step_s) || !(e.step_s > 0.0) || !std::isfinite(e.throughput_per_device)) {
    return invalid_argument("decode estimate is not a finite time (step " +
                            std::to_string(e.step_s) +
                            " s): a rate of the hardware profile or a size is out of range");
  }
  return e;
}

Result<std::optional<SloBatch>> largest_batch_under_slo(const ModelProfile& model,
                                                        const HardwareProfile& hw,
                                                        const DecodeDeployment& deployment,
                                                        double tpot_slo_s, double context_tokens,
                                                        double max_context_tokens, int max_batch) {
  if (!(tpot_slo_s > 0.0)) return invalid_argument("TPOT SLO must be > 0 seconds");
  if (max_batch < 1) return invalid_argument("max_batch must be >= 1");
  std::optional<SloBatch> best;
  for (int b = 1; b <= max_batch; ++b) {
    PS_ASSIGN_OR_RETURN(DecodeEstimate e, estimate_decode(model, hw, deployment, b, context_tokens,
                                                          max_context_tokens));
    const bool fits = e.memory.fits();
    if (e.tpot_s <= tpot_slo_s && fits) {
      best = SloBatch{b, false, std::move(e)};
      continue;
    }
    // TPOT grows with the batch, so the first miss ends the search.
    if (best) best->memory_bound = !fits;
    break;
  }
  return best;
}

}  // namespace peerserve::plan
