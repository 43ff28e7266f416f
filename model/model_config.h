// Hyperparameters of a DeepSeek-V3-family model, read from a Hugging Face config.json.
// Defaults are DeepSeek-V3's; the HF key is next to each field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace peerserve {

enum class ModelArch { kDeepseekV3, kDeepseekV2 };
enum class ScoringFunc { kSigmoid, kSoftmax };                     // scoring_func
enum class TopkMethod { kNoAuxTc, kGreedy, kGroupLimitedGreedy };  // topk_method

// rope_scaling {"type"/"rope_type": "yarn", ...}; absent means plain RoPE.
struct YarnScaling {
  double factor = 40.0;                             // factor
  int64_t original_max_position_embeddings = 4096;  // original_max_position_embeddings
  double beta_fast = 32.0;                          // beta_fast
  double beta_slow = 1.0;                           // beta_slow
  double mscale = 1.0;                              // mscale
  double mscale_all_dim = 1.0;                      // mscale_all_dim
};

struct ModelConfig {
  ModelArch arch = ModelArch::kDeepseekV3;           // architectures[0] / model_type
  int64_t vocab_size = 129280;                       // vocab_size
  int64_t hidden_size = 7168;                        // hidden_size
  int64_t intermediate_size = 18432;                 // intermediate_size (dense MLP)
  int64_t moe_intermediate_size = 2048;              // moe_intermediate_size
  int64_t num_hidden_layers = 61;                    // num_hidden_layers
  int64_t num_nextn_predict_layers = 1;              // num_nextn_predict_layers (MTP; 0 if absent)
  int64_t num_attention_heads = 128;                 // num_attention_heads
  int64_t n_shared_experts = 1;                      // n_shared_experts
  int64_t n_routed_experts = 256;                    // n_routed_experts
  double routed_scaling_factor = 2.5;                // routed_scaling_factor
  int64_t n_group = 8;                               // n_group
  int64_t topk_group = 4;                            // topk_group
  int64_t num_experts_per_tok = 8;                   // num_experts_per_tok
  int64_t moe_layer_freq = 1;                        // moe_layer_freq
  int64_t first_k_dense_replace = 3;                 // first_k_dense_replace
  bool norm_topk_prob = true;                        // norm_topk_prob
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;  // scoring_func
  TopkMethod topk_method = TopkMethod::kNoAuxTc;     // topk_method
  std::optional<int64_t> q_lora_rank = 1536;         // q_lora_rank (null: plain q_proj, V2-Lite)
  int64_t kv_lora_rank = 512;                        // kv_lora_rank
  int64_t qk_nope_head_dim = 128;                    // qk_nope_head_dim
  int64_t qk_rope_head_dim = 64;                     // qk_rope_head_dim
  int64_t v_head_dim = 128;                          // v_head_dim
  int64_t max_position_embeddings = 163840;          // max_position_embeddings
  double rms_norm_eps = 1e-6;                        // rms_norm_eps
  double rope_theta = 10000.0;                       // rope_theta
  std::optional<YarnScaling> rope_scaling;           // rope_scaling
  bool tie_word_embeddings = false;                  // tie_word_embeddings
  std::optional<int64_t> bos_token_id = 0;           // bos_token_id
  std::vector<int64_t> eos_token_ids = {1};          // eos_token_id (an integer or a list)
  // quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128]}
  std::optional<int64_t> fp8_block_rows;  // weight_block_size[0]
  std::optional<int64_t> fp8_block_cols;  // weight_block_size[1]
  // quantization_config {"quant_method": "compressed-tensors", "format": "int-quantized", ...}
  // with 8-bit symmetric per-output-channel weights (and dynamic per-token 8-bit
  // activations): W8A8 INT8 as `peerserve quantize` writes it and vLLM reads it. The
  // quantized linear weights are I8 with a "<name>_scale" [out, 1]; others stay as they are.
  bool int8_weights = false;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
};

// config.json is read whole: real ones are a few kB; this bounds a damaged one.
inline constexpr uint64_t kMaxConfigFileBytes = 16ull << 20;

// Parses and validates config.json text; errors name the field and the expected value.
// `source` (e.g. the file path) prefixes error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& path);

// The config.json text (Hugging Face keys, "architectures"/"model_type" of `config.arch`)
// that parse_model_config reads back to an equal config. Used by the test-model writer.
std::string model_config_to_json(const ModelConfig& config);

// The quantization_config object (JSON text) of a W8A8 INT8 checkpoint (int8_weights);
// `ignore` names the linear modules left unquantized (compressed-tensors' "ignore").
std::string int8_quantization_config_json(const std::vector<std::string>& ignore);

// Total parameter count of the checkpoint layout (MTP layers included).
int64_t model_parameter_count(const ModelConfig& config);

}  // namespace peerserve
