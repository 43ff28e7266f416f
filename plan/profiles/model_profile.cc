#include "plan/profiles/model_profile.h"

#include <map>

#include "plan/profiles/json_fields.h"

namespace peerserve::plan {
namespace {

ModelProfile deepseek_v3() {
  ModelProfile m;
  m.name = "deepseek-v3";
  m.num_layers = 61;
  m.num_dense_layers = 3;
  m.hidden_size = 7168;
  m.vocab_size = 129280;
  m.attention = AttentionKind::kMla;
  m.num_heads = 128;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.num_routed_experts = 256;
  m.num_shared_experts = 1;
  m.experts_per_token = 8;
  m.moe_intermediate_size = 2048;
  m.dense_intermediate_size = 18432;
  m.num_expert_groups = 8;
  m.topk_groups = 4;
  m.num_mtp_layers = 1;
  return m;
}

ModelProfile kimi_k2() {
  ModelProfile m = deepseek_v3();
  m.name = "kimi-k2";
  m.num_dense_layers = 1;
  m.vocab_size = 163840;
  m.num_heads = 64;
  m.num_routed_experts = 384;
  m.num_expert_groups = 1;
  m.topk_groups = 1;
  m.num_mtp_layers = 0;
  return m;
}

ModelProfile qwen3_235b() {
  ModelProfile m;
  m.name = "qwen3-235b-a22b";
  m.num_layers = 94;
  m.num_dense_layers = 0;
  m.hidden_size = 4096;
  m.vocab_size = 151936;
  m.attention = AttentionKind::kGqa;
  m.num_heads = 64;
  m.num_kv_heads = 4;
  m.head_dim = 128;
  m.num_routed_experts = 128;
  m.num_shared_experts = 0;
  m.experts_per_token = 8;
  m.moe_intermediate_size = 1536;
  m.dense_intermediate_size = 12288;
  return m;
}

ModelProfile deepseek_v2() {
  ModelProfile m = deepseek_v3();
  m.name = "deepseek-v2";
  m.num_layers = 60;
  m.num_dense_layers = 1;
  m.hidden_size = 5120;
  m.vocab_size = 102400;
  m.num_routed_experts = 160;
  m.num_shared_experts = 2;
  m.experts_per_token = 6;
  m.moe_intermediate_size = 1536;
  m.dense_intermediate_size = 12288;
  m.num_expert_groups = 8;
  m.topk_groups = 3;
  m.num_mtp_layers = 0;
  return m;
}

ModelProfile deepseek_v2_lite() {
  ModelProfile m;
  m.name = "deepseek-v2-lite";
  m.num_layers = 27;
  m.num_dense_layers = 1;
  m.hidden_size = 2048;
  m.vocab_size = 102400;
  m.attention = AttentionKind::kMla;
  m.num_heads = 16;
  m.q_lora_rank = 0;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.num_routed_experts = 64;
  m.num_shared_experts = 2;
  m.experts_per_token = 6;
  m.moe_intermediate_size = 1408;
  m.dense_intermediate_size = 10944;
  return m;
}

const std::map<std::string, ModelProfile (*)()>& presets() {
  static const std::map<std::string, ModelProfile (*)()> kPresets = {
      {"deepseek-v3", &deepseek_v3},
      {"deepseek-r1",
       [] {
         ModelProfile m = deepseek_v3();
         m.name = "deepseek-r1";
         return m;
       }},
      {"kimi-k2", &kimi_k2},
      {"qwen3-235b-a22b", &qwen3_235b},
      {"deepseek-v2", &deepseek_v2},
      {"deepseek-v2-lite", &deepseek_v2_lite},
  };
  return kPresets;
}

int first_present_int(JsonFields& fields, std::initializer_list<std::string_view> keys,
                      std::string_view what, bool required, int fallback) {
  for (std::string_view key : keys) {
    if (fields.has(key)) return fields.non_negative_int(key, what);
  }
  if (required) fields.add_error(*keys.begin(), "missing, expected " + std::string(what));
  return fallback;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : presets()) names.push_back(name);
  return names;
}

Result<ModelProfile> model_preset(std::string_view name) {
  auto it = presets().find(std::string(name));
  if (it != presets().end()) return it->second();
  std::string list;
  for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
  return not_found("unknown model preset '" + std::string(name) + "', expected one of: " + list);
}

Result<ModelProfile> model_profile_from_hf_config(const nlohmann::json& config,
                                                  std::string_view source, std::string_view name) {
  JsonFields f(config, std::string(source));
  ModelProfile m;
  m.name = std::string(name);
  m.num_layers = f.positive_int("num_hidden_layers", "the number of transformer layers");
  m.hidden_size = f.positive_int("hidden_size", "the hidden size");
  m.vocab_size = f.positive_int("vocab_size", "the vocabulary size");
  m.num_heads = f.positive_int("num_attention_heads", "the number of attention heads");
  if (f.has("kv_lora_rank")) {
    m.attention = AttentionKind::kMla;
    m.q_lora_rank = f.optional_non_negative_int("q_lora_rank", "the query LoRA rank").value_or(0);
    m.kv_lora_rank = f.positive_int("kv_lora_rank", "the KV latent rank");
    m.qk_nope_head_dim = f.positive_int("qk_nope_head_dim", "the non-RoPE query/key head size");
    m.qk_rope_head_dim = f.positive_int("qk_rope_head_dim", "the RoPE query/key head size");
    m.v_head_dim = f.positive_int("v_head_dim", "the value head size");
  } else {
    m.attention = AttentionKind::kGqa;
    m.num_kv_heads = f.has("num_key_value_heads")
                         ? f.positive_int("num_key_value_heads", "the number of KV heads")
                         : m.num_heads;
    m.head_dim = f.has("head_dim") ? f.positive_int("head_dim", "the head size")
                                   : (m.num_heads > 0 ? m.hidden_size / m.num_heads : 0);
  }
  m.num_routed_experts = first_present_int(f, {"n_routed_experts", "num_experts"},
                                           "the number of routed experts", true, 0);
  m.num_shared_experts =
      first_present_int(f, {"n_shared_experts"}, "the number of shared experts", false, 0);
  m.experts_per_token = f.positive_int("num_experts_per_tok", "routed experts per token (top-k)");
  m.moe_intermediate_size = f.positive_int("moe_intermediate_size", "the expert FFN size");
  m.dense_intermediate_size =
      f.has("intermediate_size") ? f.positive_int("intermediate_size", "the dense FFN size") : 0;
  if (f.has("first_k_dense_replace")) {
    m.num_dense_layers = f.non_negative_int("first_k_dense_replace", "leading dense layers");
  } else if (f.has("mlp_only_layers") && f.json()["mlp_only_layers"].is_array()) {
    m.num_dense_layers = static_cast<int>(f.json()["mlp_only_layers"].size());
  }
  m.num_expert_groups = first_present_int(f, {"n_group"}, "expert groups", false, 1);
  m.topk_groups = first_present_int(f, {"topk_group"}, "routed groups per token", false, 1);
  m.num_mtp_layers = first_present_int(f, {"num_nextn_predict_layers"}, "MTP modules", false, 0);
  PS_RETURN_IF_ERROR(f.status());
  PS_RETURN_IF_ERROR(validate_model_profile(m).with_context(source));
  return m;
}

Status validate_model_profile(const ModelProfile& m) {
  std::string problems;
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) problems += (problems.empty() ? "" : "; ") + message;
  };
  require(m.num_layers >= 1, "num_layers must be >= 1");
  require(m.num_dense_layers >= 0 && m.num_dense_layers <= m.num_layers,
          "num_dense_layers must be in [0, num_layers]");
  require(m.hidden_size >= 1, "hidden_size must be >= 1");
  require(m.num_heads >= 1, "num_heads must be >= 1");
  if (m.attention == AttentionKind::kMla) {
    require(m.kv_lora_rank >= 1 && m.qk_nope_head_dim >= 1 && m.qk_rope_head_dim >= 0 &&
                m.v_head_dim >= 1,
            "MLA needs kv_lora_rank, qk_nope_head_dim, v_head_dim >= 1");
  } else {
    require(m.num_kv_heads >= 1 && m.head_dim >= 1, "GQA needs num_kv_heads and head_dim >= 1");
    require(m.num_kv_heads <= m.num_heads, "num_kv_heads must not exceed num_heads");
  }
  // 65536: the most a routing trace can name (plan/placement/routing_trace.h); per-expert
  // tables are sized by it (1e9 asked for 8 GB per layer).
  require(m.num_routed_experts >= 1 && m.num_routed_experts <= 65536,
          "num_routed_experts must be in [1, 65536]");
  require(m.experts_per_token >= 1 && m.experts_per_token <= m.num_routed_experts,
          "experts_per_token must be in [1, num_routed_experts]");
  require(m.moe_intermediate_size >= 1, "moe_intermediate_size must be >= 1");
  require(m.num_dense_layers == 0 || m.dense_intermediate_size >= 1,
          "dense layers need dense_intermediate_size >= 1");
  require(m.num_expert_groups >= 1 && m.topk_groups >= 1 && m.topk_groups <= m.num_expert_groups,
          "topk_groups must be in [1, num_expert_groups]");
  if (!problems.empty()) return invalid_argument("model '" + m.name + "': " + problems);
  return ok_status();
}

nlohmann::json model_profile_to_json(const ModelProfile& m) {
  return {{"name", m.name},
          {"num_layers", m.num_layers},
          {"num_dense_layers", m.num_dense_layers},
          {"hidden_size", m.hidden_size},
          {"vocab_size", m.vocab_size},
          {"attention", m.attention == AttentionKind::kMla ? "mla" : "gqa"},
          {"num_heads", m.num_heads},
          {"q_lora_rank", m.q_lora_rank},
          {"kv_lora_rank", m.kv_lora_rank},
          {"qk_nope_head_dim", m.qk_nope_head_dim},
          {"qk_rope_head_dim", m.qk_rope_head_dim},
          {"v_head_dim", m.v_head_dim},
          {"num_kv_heads", m.num_kv_heads},
          {"head_dim", m.head_dim},
          {"num_routed_experts", m.num_routed_experts},
          {"num_shared_experts", m.num_shared_experts},
          {"experts_per_token", m.experts_per_token},
          {"moe_intermediate_size", m.moe_intermediate_size},
          {"dense_intermediate_size", m.dense_intermediate_size},
          {"num_expert_groups", m.num_expert_groups},
          {"topk_groups", m.topk_groups},
          {"num_mtp_layers", m.num_mtp_layers},
          {"total_weights", total_weights(m)},
          {"activated_weights_per_token", activated_weights_per_token(m)}};
}

double attention_weights_before_core(const ModelProfile& m) {
  const double h = m.hidden_size;
  const double heads = m.num_heads;
  if (m.attention == AttentionKind::kGqa) {
    return h * heads * m.head_dim + 2.0 * h * m.num_kv_heads * m.head_dim;
  }
  const double qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const double q =
      m.q_lora_rank > 0 ? h * m.q_lora_rank + m.q_lora_rank * heads * qk_dim : h * heads * qk_dim;
  const double kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim);
  const double w_uk = heads * m.qk_nope_head_dim * static_cast<double>(m.kv_lora_rank);
  return q + kv_a + w_uk;
}

double attention_weights_after_core(const ModelProfile& m) {
  const double h = m.hidden_size;
  const double heads = m.num_heads;
  if (m.attention == AttentionKind::kGqa) return heads * m.head_dim * h;
  const double w_uv = heads * static_cast<double>(m.kv_lora_rank) * m.v_head_dim;
  return w_uv + heads * m.v_head_dim * h;
}

double attention_weights_per_layer(const ModelProfile& m) {
  return attention_weights_before_core(m) + attention_weights_after_core(m);
}

double expert_weights(const ModelProfile& m) {
  return 3.0 * m.hidden_size * static_cast<double>(m.moe_intermediate_size);
}

double dense_ffn_weights(const ModelProfile& m) {
  return 3.0 * m.hidden_size * static_cast<double>(m.dense_intermediate_size);
}

double gate_weights(const ModelProfile& m) {
  return static_cast<double>(m.hidden_size) * m.num_routed_experts;
}

double embedding_weights(const ModelProfile& m) {
  return static_cast<double>(m.vocab_size) * m.hidden_size;
}

double total_weights(const ModelProfile& m) {
  const double moe_layer =
      (m.num_routed_experts + m.num_shared_experts) * expert_weights(m) + gate_weights(m);
  return m.num_layers * attention_weights_per_layer(m) + m.num_dense_layers * dense_ffn_weights(m) +
         m.num_moe_layers() * moe_layer + 2.0 * embedding_weights(m);
}

double activated_weights_per_token(const ModelProfile& m) {
  const double moe_layer =
      (m.experts_per_token + m.num_shared_experts) * expert_weights(m) + gate_weights(m);
  return m.num_layers * attention_weights_per_layer(m) + m.num_dense_layers * dense_ffn_weights(m) +
         m.num_moe_layers() * moe_layer;
}

double kv_elements_per_token_per_layer(const ModelProfile& m) {
  if (m.attention == AttentionKind::kGqa) return 2.0 * m.num_kv_heads * m.head_dim;
  return static_cast<double>(m.kv_lora_rank) + m.qk_rope_head_dim;
}

double kv_bytes_per_token(const ModelProfile& m, double bytes_per_element) {
  return kv_elements_per_token_per_layer(m) * bytes_per_element * m.num_layers;
}

double attention_core_flops_prefill(const ModelProfile& m, double context) {
  if (m.attention == AttentionKind::kGqa) return 2.0 * m.num_heads * 2.0 * m.head_dim * context;
  const double dims = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim;
  return 2.0 * m.num_heads * dims * context;
}

double attention_core_flops_decode(const ModelProfile& m, double context) {
  if (m.attention == AttentionKind::kGqa) return 2.0 * m.num_heads * 2.0 * m.head_dim * context;
  const double dims = 2.0 * m.kv_lora_rank + m.qk_rope_head_dim;
  return 2.0 * m.num_heads * dims * context;
}

double causal_mean_context(double cached_tokens, double new_tokens) {
  return cached_tokens + (new_tokens + 1.0) / 2.0;
}

}  // namespace peerserve::plan

namespace peerserve::plan {

double forward_flops_per_token(const ModelProfile& m, double sequence_tokens) {
  const double linear = 2.0 * (activated_weights_per_token(m) + embedding_weights(m));
  const double attention =
      m.num_layers * attention_core_flops_prefill(m, causal_mean_context(0.0, sequence_tokens));
  return linear + attention;
}

}  // namespace peerserve::plan
