// The shape of a mixture-of-experts transformer as far as cost and memory are concerned:
// layer counts, dimensions, attention kind (MLA or GQA), experts, top-k, MTP. Built from a
// Hugging Face config.json or from a built-in preset; every derived quantity (parameters,
// FLOPs per token, KV bytes per token) is a function below, with its formula next to it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve::plan {

enum class AttentionKind {
  kMla,  // multi-head latent attention: one compressed latent (+ RoPE key) cached per token
  kGqa,  // grouped-query attention: K and V per KV head cached per token
};

struct ModelProfile {
  std::string name;
  int num_layers = 0;        // transformer layers, not counting MTP modules
  int num_dense_layers = 0;  // leading layers with a dense FFN instead of MoE
  int hidden_size = 0;
  int vocab_size = 0;

  AttentionKind attention = AttentionKind::kMla;
  int num_heads = 0;
  // MLA
  int q_lora_rank = 0;  // 0: queries are projected directly from the hidden state
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // GQA
  int num_kv_heads = 0;
  int head_dim = 0;

  int num_routed_experts = 0;
  int num_shared_experts = 0;
  int experts_per_token = 0;  // routed top-k
  int moe_intermediate_size = 0;
  int dense_intermediate_size = 0;
  int num_expert_groups = 1;  // group-limited routing (DeepSeek-V3: 8 groups, top-4 groups)
  int topk_groups = 1;
  int num_mtp_layers = 0;

  int num_moe_layers() const { return num_layers - num_dense_layers; }
};

// Built-in presets: "deepseek-v3", "deepseek-r1" (same shape), "kimi-k2",
// "qwen3-235b-a22b", "deepseek-v2", "deepseek-v2-lite".
std::vector<std::string> model_preset_names();
Result<ModelProfile> model_preset(std::string_view name);

// From a Hugging Face config.json (DeepSeek-V2/V3, Kimi-K2 and Qwen3-MoE key names).
// `source` names the file in error messages.
Result<ModelProfile> model_profile_from_hf_config(const nlohmann::json& config,
                                                  std::string_view source, std::string_view name);
Status validate_model_profile(const ModelProfile& model);
nlohmann::json model_profile_to_json(const ModelProfile& model);

// ---- Derived quantities (element counts; multiply by bytes per element for memory) ----

// Attention projection weights of one layer. MLA: q_a + q_b (or q) + kv_a + kv_b + o;
// GQA: q + k + v + o.
double attention_weights_per_layer(const ModelProfile& model);
// Weights an MLA decode step reads before the latent attention (q_a, q_b with W_UK absorbed,
// kv_a) and after it (W_UV absorbed, o); together equal to attention_weights_per_layer.
double attention_weights_before_core(const ModelProfile& model);
double attention_weights_after_core(const ModelProfile& model);
double expert_weights(const ModelProfile& model);     // 3 * hidden * moe_intermediate (SwiGLU)
double dense_ffn_weights(const ModelProfile& model);  // 3 * hidden * intermediate
double gate_weights(const ModelProfile& model);       // hidden * routed experts
double embedding_weights(const ModelProfile& model);  // vocab * hidden (input; lm_head the same)
double total_weights(const ModelProfile& model);      // without MTP modules
double activated_weights_per_token(const ModelProfile& model);  // without embeddings

// Forward FLOPs per token of a training sequence of `sequence_tokens`: 2 x (activated
// weights + LM head) + causal attention at the mean context (plain multi-head form).
double forward_flops_per_token(const ModelProfile& model, double sequence_tokens);

// KV cache elements per token per layer: MLA kv_lora + rope; GQA 2 * kv_heads * head_dim.
double kv_elements_per_token_per_layer(const ModelProfile& model);
// KV bytes per token over all layers (MTP layers excluded).
double kv_bytes_per_token(const ModelProfile& model, double bytes_per_element);

// Attention core FLOPs for one query token attending `context` tokens.
// Prefill (MLA in plain multi-head form): 2 * heads * (qk_nope + qk_rope + v) * context.
// Decode (MLA absorbed: scores over the kv_lora + rope latent, values over kv_lora):
//   2 * heads * (2 * kv_lora + rope) * context.  GQA: 2 * heads * 2 * head_dim * context.
double attention_core_flops_prefill(const ModelProfile& model, double context);
double attention_core_flops_decode(const ModelProfile& model, double context);

// Average attended context of the new tokens when `new_tokens` follow `cached_tokens` under a
// causal mask: cached + (new + 1) / 2.
double causal_mean_context(double cached_tokens, double new_tokens);

}  // namespace peerserve::plan
