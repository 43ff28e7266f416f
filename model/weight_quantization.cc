#include "model/weight_quantization.h"

#include <memory>
#include <string>

namespace peerserve {
namespace {

kernels::MatrixView<bf16> view(const LinearWeight& w) {
  return kernels::MatrixView<bf16>{w.data, w.rows, w.cols, 0};
}

Status quantize_linear(LinearWeight& w, const char* what) {
  if (w.data == nullptr || w.int8) return ok_status();
  auto packed = kernels::PackedInt8Matrix::quantize(view(w));
  if (!packed.ok()) return packed.status().with_context(std::string("quantizing ") + what);
  w.int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
  return ok_status();
}

Status quantize_attention(AttentionWeights& a) {
  if (a.q_a) PS_RETURN_IF_ERROR(quantize_linear(*a.q_a, "q_a_proj"));
  if (a.q_b) PS_RETURN_IF_ERROR(quantize_linear(*a.q_b, "q_b_proj"));
  if (a.q_proj) PS_RETURN_IF_ERROR(quantize_linear(*a.q_proj, "q_proj"));
  PS_RETURN_IF_ERROR(quantize_linear(a.kv_a, "kv_a_proj_with_mqa"));
  return quantize_linear(a.o_proj, "o_proj");
}

Status quantize_layer(DecoderLayerWeights& layer) {
  PS_RETURN_IF_ERROR(quantize_attention(layer.attention));
  if (layer.dense_mlp) PS_RETURN_IF_ERROR(quantize_mlp_int8(*layer.dense_mlp));
  if (layer.moe) {
    if (layer.moe->shared) PS_RETURN_IF_ERROR(quantize_mlp_int8(*layer.moe->shared));
    for (MlpWeights& expert : layer.moe->experts) PS_RETURN_IF_ERROR(quantize_mlp_int8(expert));
  }
  return ok_status();
}

}  // namespace

Status quantize_mlp_int8(MlpWeights& mlp) {
  PS_RETURN_IF_ERROR(quantize_linear(mlp.gate, "gate_proj"));
  PS_RETURN_IF_ERROR(quantize_linear(mlp.up, "up_proj"));
  PS_RETURN_IF_ERROR(quantize_linear(mlp.down, "down_proj"));
  if (!mlp.gate_up_int8) {
    auto packed = kernels::PackedInt8Matrix::quantize_gate_up(view(mlp.gate), view(mlp.up));
    if (!packed.ok()) return packed.status().with_context("quantizing gate_proj/up_proj");
    mlp.gate_up_int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
  }
  return ok_status();
}

Status quantize_weights_int8(DeepseekWeights& weights, bool lm_head) {
  for (DecoderLayerWeights& layer : weights.layers) PS_RETURN_IF_ERROR(quantize_layer(layer));
  if (weights.mtp) {
    PS_RETURN_IF_ERROR(quantize_linear(weights.mtp->eh_proj, "mtp eh_proj"));
    PS_RETURN_IF_ERROR(quantize_layer(weights.mtp->layer));
    if (lm_head) PS_RETURN_IF_ERROR(quantize_linear(weights.mtp->head, "mtp shared_head"));
  }
  if (lm_head) PS_RETURN_IF_ERROR(quantize_linear(weights.lm_head, "lm_head"));
  return ok_status();
}

}  // namespace peerserve
