// The weights of a DeepSeek-V3-family model as the forward pass uses them, loaded from a
// Checkpoint by the Hugging Face names of model/checkpoint/tensor_layout.h.
//
// Linear weights are bf16 [out, in] (zero-copy views into the checkpoint mapping when
// stored as BF16; dequantized copies for FP8); norms, router weights and the router bias
// are fp32. Each BF16 view keeps its storage alive.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "kernels/bf16_matrix.h"
#include "kernels/int8_matrix.h"
#include "model/model_config.h"
#include "tensor/float_convert.h"

namespace peerserve {

class Checkpoint;

// The weight of a linear layer [rows, cols] = [out, in]: bf16 row-major, and, when the model
// is quantized (ModelOptions::quantize), also packed INT8 with per-row scales, which linear()
// then uses instead (W8A8, kernels/matmul_int8.h); or, when the model repacks its BF16
// weights (ModelOptions::pack_bf16), also the same values in the layout of
// kernels/bf16_matrix.h, which linear() uses for bf16 activations.
struct LinearWeight {
  const bf16* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  std::shared_ptr<const void> storage;
  std::shared_ptr<const kernels::PackedInt8Matrix> int8;
  // With int8: the error compensation added to each output row (INT8 checkpoints written with
  // `--pipeline ...+compensate`, docs/quantization.md), or null.
  std::shared_ptr<const std::vector<float>> int8_compensation;
  std::shared_ptr<const kernels::PackedBf16Matrix> bf16_packed;
};

// Forgets w's BF16 form (data and its storage) once the kernels read an INT8 one, as for an
// INT8 checkpoint's weights, which have none. For a weight converted at load (FP8, F32) this
// frees the copy; for a view of the checkpoint mapping, release its pages first.
void drop_bf16_form(LinearWeight& w);

// y[i, :] += w.int8_compensation for the m rows of a product with w (y_stride 0: w.rows);
// nothing without a compensation. Call it after the INT8 product.
void add_int8_compensation(const LinearWeight& w, int64_t m, float* y, int64_t y_stride = 0);

struct MlpWeights {   // down(silu(gate(x)) * up(x))
  LinearWeight gate;  // [inter, hidden]
  LinearWeight up;    // [inter, hidden]
  LinearWeight down;  // [hidden, inter]
  // Quantized: gate and up packed together for the fused gate/up/SiLU kernel.
  std::shared_ptr<const kernels::PackedInt8Matrix> gate_up_int8;
};

struct AttentionWeights {
  // q_lora_rank set: q = q_b(q_a_norm(q_a(x))); else q = q_proj(x).
  std::optional<LinearWeight> q_a;     // [q_lora_rank, hidden]
  std::vector<float> q_a_norm;         // [q_lora_rank]
  std::optional<LinearWeight> q_b;     // [heads * qk_head_dim, q_lora_rank]
  std::optional<LinearWeight> q_proj;  // [heads * qk_head_dim, hidden]
  LinearWeight kv_a;                   // [kv_lora_rank + qk_rope_head_dim, hidden]
  std::vector<float> kv_a_norm;        // [kv_lora_rank]
  LinearWeight kv_b;                   // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  LinearWeight o_proj;                 // [hidden, heads * v_head_dim]
  // W_UK of head h transposed, for the absorbed form: [heads, kv_lora_rank, qk_nope_head_dim],
  // w_uk_t[h][c][d] = kv_b[h * (nope + v) + d][c]. Owned; freed once packed (below).
  std::vector<bf16> w_uk_t;
  // With packed BF16 weights (model/weight_packing.h): the absorbed form's per-head products
  // packed, W_UK of head h from w_uk_t ([kv_lora_rank, nope]) and W_UV from kv_b's value rows
  // ([v_head_dim, kv_lora_rank]); empty otherwise.
  std::vector<std::shared_ptr<const kernels::PackedBf16Matrix>> w_uk_packed, w_uv_packed;
};

struct MoeWeights {
  std::vector<float> router;         // [n_routed_experts, hidden]
  std::vector<float> bias;           // [n_routed_experts] (V3's e_score_correction_bias) or empty
  std::vector<MlpWeights> experts;   // the routed experts this process holds
  std::vector<int32_t> expert_ids;   // logical id of experts[i] (0, 1, ... when all are held)
  std::optional<MlpWeights> shared;  // intermediate moe_intermediate_size * n_shared_experts
};

struct DecoderLayerWeights {
  int64_t index = 0;  // HF layer index (num_hidden_layers for the MTP layer)
  std::vector<float> input_norm;
  std::vector<float> post_attention_norm;
  AttentionWeights attention;
  std::optional<MlpWeights> dense_mlp;  // first_k_dense_replace layers
  std::optional<MoeWeights> moe;
};

struct MtpWeights {
  LinearWeight embed;        // [vocab, hidden]
  std::vector<float> enorm;  // [hidden]
  std::vector<float> hnorm;  // [hidden]
  LinearWeight eh_proj;      // [hidden, 2 * hidden]
  DecoderLayerWeights layer;
  std::vector<float> head_norm;  // shared_head.norm
  LinearWeight head;             // shared_head.head [vocab, hidden]
};

struct DeepseekWeights {
  LinearWeight embed;  // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm;
  LinearWeight lm_head;  // [vocab, hidden] (embed_tokens when tie_word_embeddings)
  std::optional<MtpWeights> mtp;
};

// Per MoE layer, the logical ids of the routed experts to load (see
// ModelOptions::routed_experts); an empty function loads all of them.
using RoutedExpertSelector = std::function<std::vector<int32_t>(int64_t layer)>;

// Loads every weight the model uses; with load_mtp == false the MTP tensors are read as
// unused-but-expected, and so are the routed experts `select` leaves out. Fails on a
// missing or misshaped tensor, on tensors left over, and on a selected expert id outside
// [0, n_routed_experts).
Result<DeepseekWeights> load_deepseek_weights(Checkpoint& checkpoint, bool load_mtp,
                                              const RoutedExpertSelector& select = {});

// One routed expert of one layer (e.g. to add a copy when the expert placement changes).
Result<MlpWeights> load_routed_expert(Checkpoint& checkpoint, int64_t layer, int64_t expert);

}  // namespace peerserve
