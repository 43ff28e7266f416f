// The tensor layout of a DeepSeek-V3-family checkpoint (Hugging Face names and shapes, as in
// modeling_deepseek.py), derived from its ModelConfig. This is the single source of truth
// for the layout: the checkpoint validator, the test-model writer and the model's weight
// loading all use it. Linear weights are [out_features, in_features].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace peerserve {

enum class TensorRole {
  kEmbedding,   // model.embed_tokens, MTP embed_tokens: [vocab, hidden]
  kLinear,      // projections inside decoder layers (and MTP eh_proj); FP8 in V3 checkpoints
  kNorm,        // RMSNorm weights: [dim]
  kRouterGate,  // mlp.gate.weight: [n_routed_experts, hidden]
  kRouterBias,  // mlp.gate.e_score_correction_bias (V3 only): [n_routed_experts], F32 in V3
  kOutputHead,  // lm_head, MTP shared_head.head: [vocab, hidden]
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::kLinear;
  int64_t layer = -1;  // decoder layer index (num_hidden_layers.. for MTP); -1 outside layers
};

// FP8 checkpoints store these roles as F8_E4M3 + "<name>_scale_inv"; all others stay BF16/F32.
inline bool is_fp8_quantizable(TensorRole role) {
  return role == TensorRole::kLinear;
}

// "model.layers.3.mlp.experts.0.up_proj.weight" -> "...up_proj.weight_scale_inv".
std::string fp8_scale_inv_name(const std::string& weight_name);

// INT8 (W8A8) checkpoints store quantized weights as I8 + "<name>_scale" [out, 1] (the
// compressed-tensors naming): "...up_proj.weight" -> "...up_proj.weight_scale".
std::string int8_scale_name(const std::string& weight_name);
// An I8 GEMM weight may also carry an error compensation "<name>_compensation" (F32 [out]):
// added to the product's output rows (docs/quantization.md, "Error compensation").
std::string int8_compensation_name(const std::string& weight_name);
// Roles whose weights may be stored INT8: linear layers and the output head (a GEMM each);
// embeddings too (gathered rows, dequantized at load).
inline bool is_int8_storable(TensorRole role) {
  return role == TensorRole::kLinear || role == TensorRole::kOutputHead ||
         role == TensorRole::kEmbedding;
}

// Every tensor of the checkpoint in a fixed order: embed_tokens, layers 0..num_hidden_layers-1,
// model.norm, lm_head (absent when tie_word_embeddings), then the MTP layers
// L = num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1, each with
// embed_tokens, enorm, hnorm, eh_proj, shared_head.norm, shared_head.head and a full decoder
// layer. Per decoder layer i ("model.layers.{i}."):
//   input_layernorm.weight [hidden]
//   self_attn.q_a_proj.weight [q_lora_rank, hidden], self_attn.q_a_layernorm.weight
//     [q_lora_rank], self_attn.q_b_proj.weight [heads * qk_head_dim, q_lora_rank]
//     -- or self_attn.q_proj.weight [heads * qk_head_dim, hidden] when q_lora_rank is null
//   self_attn.kv_a_proj_with_mqa.weight [kv_lora_rank + qk_rope_head_dim, hidden]
//   self_attn.kv_a_layernorm.weight [kv_lora_rank]
//   self_attn.kv_b_proj.weight [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
//   self_attn.o_proj.weight [hidden, heads * v_head_dim]
//   post_attention_layernorm.weight [hidden]
//   dense (i < first_k_dense_replace): mlp.{gate,up}_proj.weight [intermediate, hidden],
//     mlp.down_proj.weight [hidden, intermediate]
//   MoE: mlp.gate.weight [n_routed, hidden], mlp.gate.e_score_correction_bias [n_routed]
//     (V3 only), mlp.experts.{e}.{gate,up,down}_proj.weight ([moe_inter, hidden] /
//     [hidden, moe_inter]), mlp.shared_experts.{gate,up,down}_proj.weight with
//     intermediate moe_intermediate_size * n_shared_experts (absent if n_shared_experts == 0).
// MTP extras: embed_tokens [vocab, hidden], enorm/hnorm [hidden], eh_proj [hidden, 2*hidden],
//   shared_head.norm [hidden], shared_head.head [vocab, hidden].
std::vector<TensorSpec> deepseek_tensor_layout(const ModelConfig& config);

}  // namespace peerserve
