#include "model/checkpoint/tensor_layout.h"

namespace peerserve {
namespace {

class LayoutBuilder {
 public:
  explicit LayoutBuilder(const ModelConfig& c) : c_(c) {}

  void add(std::string name, std::vector<int64_t> shape, TensorRole role, int64_t layer = -1) {
    specs_.push_back({std::move(name), std::move(shape), role, layer});
  }

  void add_mlp(const std::string& prefix, int64_t intermediate, int64_t layer) {
    const int64_t h = c_.hidden_size;
    add(prefix + "gate_proj.weight", {intermediate, h}, TensorRole::kLinear, layer);
    add(prefix + "up_proj.weight", {intermediate, h}, TensorRole::kLinear, layer);
    add(prefix + "down_proj.weight", {h, intermediate}, TensorRole::kLinear, layer);
  }

  void add_decoder_layer(int64_t i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int64_t h = c_.hidden_size, heads = c_.num_attention_heads;
    add(p + "input_layernorm.weight", {h}, TensorRole::kNorm, i);
    if (c_.q_lora_rank) {
      const int64_t q = *c_.q_lora_rank;
      add(p + "self_attn.q_a_proj.weight", {q, h}, TensorRole::kLinear, i);
      add(p + "self_attn.q_a_layernorm.weight", {q}, TensorRole::kNorm, i);
      add(p + "self_attn.q_b_proj.weight", {heads * c_.qk_head_dim(), q}, TensorRole::kLinear, i);
    } else {
      add(p + "self_attn.q_proj.weight", {heads * c_.qk_head_dim(), h}, TensorRole::kLinear, i);
    }
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {c_.kv_lora_rank + c_.qk_rope_head_dim, h},
        TensorRole::kLinear, i);
    add(p + "self_attn.kv_a_layernorm.weight", {c_.kv_lora_rank}, TensorRole::kNorm, i);
    add(p + "self_attn.kv_b_proj.weight",
        {heads * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank}, TensorRole::kLinear, i);
    add(p + "self_attn.o_proj.weight", {h, heads * c_.v_head_dim}, TensorRole::kLinear, i);
    add(p + "post_attention_layernorm.weight", {h}, TensorRole::kNorm, i);
    if (!c_.is_moe_layer(i)) {
      add_mlp(p + "mlp.", c_.intermediate_size, i);
      return;
    }
    add(p + "mlp.gate.weight", {c_.n_routed_experts, h}, TensorRole::kRouterGate, i);
    if (c_.arch == ModelArch::kDeepseekV3) {
      add(p + "mlp.gate.e_score_correction_bias", {c_.n_routed_experts}, TensorRole::kRouterBias,
          i);
    }
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      add_mlp(p + "mlp.experts." + std::to_string(e) + ".", c_.moe_intermediate_size, i);
    }
    if (c_.n_shared_experts > 0) {
      add_mlp(p + "mlp.shared_experts.", c_.moe_intermediate_size * c_.n_shared_experts, i);
    }
  }

  void add_mtp_layer(int64_t i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int64_t h = c_.hidden_size, v = c_.vocab_size;
    add(p + "embed_tokens.weight", {v, h}, TensorRole::kEmbedding, i);
    add(p + "enorm.weight", {h}, TensorRole::kNorm, i);
    add(p + "hnorm.weight", {h}, TensorRole::kNorm, i);
    add(p + "eh_proj.weight", {h, 2 * h}, TensorRole::kLinear, i);
    add(p + "shared_head.norm.weight", {h}, TensorRole::kNorm, i);
    add(p + "shared_head.head.weight", {v, h}, TensorRole::kOutputHead, i);
    add_decoder_layer(i);
  }

  std::vector<TensorSpec> build() && {
    add("model.embed_tokens.weight", {c_.vocab_size, c_.hidden_size}, TensorRole::kEmbedding);
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) add_decoder_layer(i);
    add("model.norm.weight", {c_.hidden_size}, TensorRole::kNorm);
    if (!c_.tie_word_embeddings) {
      add("lm_head.weight", {c_.vocab_size, c_.hidden_size}, TensorRole::kOutputHead);
    }
    for (int64_t k = 0; k < c_.num_nextn_predict_layers; ++k) {
      add_mtp_layer(c_.num_hidden_layers + k);
    }
    return std::move(specs_);
  }

 private:
  const ModelConfig& c_;
  std::vector<TensorSpec> specs_;
};

}  // namespace

std::string int8_scale_name(const std::string& weight_name) {
  return weight_name + "_scale";
}

std::string int8_compensation_name(const std::string& weight_name) {
  return weight_name + "_compensation";
}

std::string fp8_scale_inv_name(const std::string& weight_name) {
  return weight_name + "_scale_inv";
}

std::vector<TensorSpec> deepseek_tensor_layout(const ModelConfig& config) {
  return LayoutBuilder(config).build();
}

}  // namespace peerserve
