#include "plan/analytic/prefill_model.h"

#include <cmath>
#include <string>

#include "plan/analytic/all_to_all.h"
#include "plan/analytic/device_rates.h"
#include "plan/analytic/expert_load.h"

namespace peerserve::plan {
namespace {

struct PrefillContext {
  const ModelProfile& model;
  const HardwareProfile& hw;
  const PrefillDeployment& deployment;
  DeviceRates rates;
  double weight_bytes = 1.0;
  double activation_bytes = 2.0;
  double dispatch_bytes = 0.0;
  double combine_bytes = 0.0;
  double remote_nodes_per_token = 0.0;
};

// Collective inside the attention TP group: `bytes` received per device.
OperatorTime tp_collective(const PrefillContext& cx, const char* name, double bytes) {
  OperatorTime op;
  op.name = name;
  op.stream = OperatorStream::kAttention;
  const LinkProfile& link = cx.hw.link_for_group(cx.deployment.attention_tp);
  op.fixed_s = link.latency_us * 1e-6;
  op.link_s = bytes / (link.bandwidth_gb_s * 1e9 * cx.hw.efficiency.all_to_all);
  return op;
}

std::vector<OperatorTime> layer_operators(const PrefillContext& cx, const PrefillBatch& b,
                                          bool moe) {
  const ModelProfile& m = cx.model;
  const auto attention = OperatorStream::kAttention;
  const auto moe_stream = OperatorStream::kMoe;
  const int tp = cx.deployment.attention_tp;
  const double w = cx.weight_bytes;
  std::vector<OperatorTime> ops;
  auto compute = [&ops](const char* name, OperatorStream stream, double seconds) {
    OperatorTime op;
    op.name = name;
    op.stream = stream;
    op.compute_s = seconds;
    ops.push_back(op);
  };
  if (m.attention == AttentionKind::kMla) {
    const double hidden = m.hidden_size;
    const double qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double latent = m.kv_lora_rank + m.qk_rope_head_dim;
    const double q_down = m.q_lora_rank > 0 ? hidden * m.q_lora_rank : hidden * m.num_heads * qk;
    const double q_up =
        m.q_lora_rank > 0 ? static_cast<double>(m.q_lora_rank) * m.num_heads * qk : 0.0;
    const double kv_b =
        static_cast<double>(m.kv_lora_rank) * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim);
    compute("mla_down", attention,
            gemm_seconds(cx.rates, q_down + hidden * latent, b.new_tokens, w));
    if (tp > 1) {
      const double q_width = m.q_lora_rank > 0 ? m.q_lora_rank : m.num_heads * qk;
      const double bytes = (tp - 1.0) *
                           (b.new_tokens * (q_width + latent) + b.cached_tokens * latent) *
                           cx.activation_bytes;
      ops.push_back(tp_collective(cx, "tp_all_gather", bytes));
    }
    compute("mla_up", attention,
            gemm_seconds(cx.rates, q_up + kv_b, b.new_tokens, w) +
                gemm_seconds(cx.rates, kv_b, b.cached_tokens, w));
  } else {
    compute("qkv_proj", attention,
            gemm_seconds(cx.rates, attention_weights_before_core(m), b.new_tokens, w));
  }
  const double core_flops = attention_core_flops_prefill(m, 1.0) * b.attended_context;
  compute("attention_core", attention, attention_seconds(cx.rates, core_flops, 0.0));
  if (tp > 1) {
    const double v_width =
        m.attention == AttentionKind::kMla ? m.num_heads * m.v_head_dim : m.num_heads * m.head_dim;
    ops.push_back(tp_collective(cx, "tp_all_to_all",
                                (tp - 1.0) / tp * b.new_tokens * v_width * cx.activation_bytes));
  }
  const double o_weights = m.attention == AttentionKind::kMla
                               ? static_cast<double>(m.num_heads) * m.v_head_dim * m.hidden_size
                               : attention_weights_after_core(m);
  compute("o_proj", attention, gemm_seconds(cx.rates, o_weights, b.new_tokens, w));
  if (!moe) {
    compute("dense_ffn", moe_stream, gemm_seconds(cx.rates, dense_ffn_weights(m), b.new_tokens, w));
    return ops;
  }
  const ExpertPlacement& placement = cx.deployment.experts;
  const ExpertLoad load = expert_load(m, placement, b.new_tokens);
  compute(
      "gate", moe_stream,
      gemm_seconds(cx.rates, gate_weights(m), b.new_tokens, bytes_per_element(Precision::kBf16)));
  AllToAllCall call;
  call.ranks = placement.devices;
  call.tokens = b.new_tokens;
  call.copies_per_token = load.copies_per_token;
  call.dedup_per_node = cx.deployment.dedup_per_node;
  call.remote_nodes_per_token = cx.remote_nodes_per_token;
  call.copy_engine = true;
  auto exchange = [&](const char* name, double bytes_per_copy) {
    call.bytes_per_copy = bytes_per_copy;
    const AllToAllTime t = all_to_all_time(cx.hw, call);
    OperatorTime op;
    op.name = name;
    op.stream = moe_stream;
    op.link_s = t.transfer_s;
    op.fixed_s = t.fixed_s;
    ops.push_back(op);
  };
  exchange("dispatch", cx.dispatch_bytes);
  compute("experts", moe_stream, expert_seconds(m, load, cx.rates, w));
  exchange("combine", cx.combine_bytes);
  return ops;
}

LayerEstimate estimate_layer(const PrefillContext& cx, const PrefillBatch& b, bool moe) {
  PrefillBatch half = b;
  half.new_tokens /= 2.0;
  half.cached_tokens /= 2.0;
  half.attended_context /= 2.0;
  return layer_estimate(layer_operators(cx, b, moe), layer_operators(cx, half, moe),
                        cx.deployment.microbatching, PipelineKind::kSharedCores);
}

}  // namespace

PrefillBatch uniform_prefill_batch(double requests_per_device, double prompt_tokens,
                                   double reuse_fraction) {
  PrefillBatch b;
  const double cached = prompt_tokens * reuse_fraction;
  const double fresh = prompt_tokens - cached;
  b.new_tokens = requests_per_device * fresh;
  b.cached_tokens = requests_per_device * cached;
  b.attended_context = requests_per_device * fresh * causal_mean_context(cached, fresh);
  return b;
}

Result<PrefillEstimate> estimate_prefill(const ModelProfile& model, const HardwareProfile& hw,
                                         const PrefillDeployment& deployment,
                                         const PrefillBatch& batch,
                                         const std::string& memory_pool_path) {
  PS_RETURN_IF_ERROR(validate_prefill_deployment(deployment, model));
  if (!(batch.new_tokens >= 0.0) || !(batch.cached_tokens >= 0.0) ||
      !(batch.attended_context >= 0.0) || batch.new_tokens + batch.cached_tokens <= 0.0 ||
      !(batch.new_tokens + batch.cached_tokens + batch.attended_context <= kMaxEstimateTokens)) {
    return invalid_argument("prefill batch needs new_tokens + cached_tokens > 0, all >= 0 and " +
                            std::string("finite (at most 1e12 tokens)"));
  }
  PS_ASSIGN_OR_RETURN(DeviceRates rates, device_rates(hw, deployment.precision, true));
  PrefillContext cx{model, hw, deployment, rates};
  cx.weight_bytes = bytes_per_element(deployment.precision.weights);
  cx.activation_bytes = bytes_per_element(deployment.precision.activations);
  cx.dispatch_bytes = dispatch_bytes_per_copy(model, deployment.precision);
  cx.combine_bytes = combine_bytes_per_copy(model, deployment.precision);
  cx.remote_nodes_per_token =
      expected_remote_nodes_per_token(model, deployment.experts.devices, hw.scale_up_domain);

  PrefillEstimate e;
  e.batch = batch;
  if (batch.new_tokens > 0.0) {
    e.moe_layer = estimate_layer(cx, batch, true);
    e.dense_layer = estimate_layer(cx, batch, false);
  }
  if (batch.cached_tokens > 0.0) {
    PS_ASSIGN_OR_RETURN(LinkProfile pool, hw.memory_pool_path(memory_pool_path));
    const double bytes =
        batch.cached_tokens *
        kv_bytes_per_token(model, bytes_per_element(deployment.precision.kv_cache));
    e.cache_load_s = pool.latency_us * 1e-6 + bytes / (pool.bandwidth_gb_s * 1e9);
  }
  e.fixed_s = hw.fixed.prefill_batch_ms * 1e-3;
  e.batch_s = model.num_moe_layers() * e.moe_layer.seconds +
              model.num_dense_layers * e.dense_layer.seconds + e.cache_load_s + e.fixed_s;
  e.throughput_per_device = (batch.new_tokens + batch.cached_tokens) / e.batch_s;
  e.throughput_per_package = e.throughput_per_device * hw.devices_per_package;
  PS_ASSIGN_OR_RETURN(const double peak, hw.peak_flops(deployment.precision.weights));
  e.tokens_per_s_per_tflops = e.throughput_per_device / (peak / 1e12);
  if (!std::isfinite(e.batch_s) || !(e.batch_s > 0.0) || !std::isfinite(e.throughput_per_device)) {
    return invalid_argument("prefill estimate is not a finite time (batch " +
                            std::to_string(e.batch_s) +
                            " s): a rate of the hardware profile or a size is out of range");
  }
  return e;
}

}  // namespace peerserve::plan
