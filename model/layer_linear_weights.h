// The linear weights of a decoder layer in one list, for the load-time passes that give them
// other forms (weight_packing.cc: packed BF16; weight_quantization.cc: INT8).
#pragma once

#include <functional>
#include <string>

#include "model/deepseek_weights.h"

namespace peerserve {

using LinearVisitor = std::function<void(LinearWeight& weight, const std::string& name)>;
using MlpVisitor = std::function<void(MlpWeights& mlp, const std::string& name)>;

// gate, up and down of `mlp` ("<name> gate_proj", ...), then mlp(mlp, name) when given.
inline void for_each_mlp_linear(MlpWeights& mlp, const std::string& name,
                                const LinearVisitor& linear, const MlpVisitor& whole = {}) {
  linear(mlp.gate, name + " gate_proj");
  linear(mlp.up, name + " up_proj");
  linear(mlp.down, name + " down_proj");
  if (whole) whole(mlp, name);
}

// Every linear weight of `layer` that the forward multiplies through linear() /
// grouped_linear(): the attention's q_a, q_b or q_proj, kv_a, kv_b and o_proj ("<prefix>
// q_a_proj", ...), then the dense MLP ("<prefix> mlp"), the shared expert ("<prefix> shared
// expert") and each routed expert ("<prefix> expert E") as for_each_mlp_linear.
inline void for_each_layer_linear(DecoderLayerWeights& layer, const std::string& prefix,
                                  const LinearVisitor& linear, const MlpVisitor& whole = {}) {
  AttentionWeights& a = layer.attention;
  if (a.q_a) linear(*a.q_a, prefix + " q_a_proj");
  if (a.q_b) linear(*a.q_b, prefix + " q_b_proj");
  if (a.q_proj) linear(*a.q_proj, prefix + " q_proj");
  linear(a.kv_a, prefix + " kv_a_proj_with_mqa");
  linear(a.kv_b, prefix + " kv_b_proj");
  linear(a.o_proj, prefix + " o_proj");
  if (layer.dense_mlp) for_each_mlp_linear(*layer.dense_mlp, prefix + " mlp", linear, whole);
  if (layer.moe) {
    if (layer.moe->shared) {
      for_each_mlp_linear(*layer.moe->shared, prefix + " shared expert", linear, whole);
    }
    for (size_t e = 0; e < layer.moe->experts.size(); ++e) {
      for_each_mlp_linear(layer.moe->experts[e], prefix + " expert " + std::to_string(e), linear,
                          whole);
    }
  }
}

}  // namespace peerserve
