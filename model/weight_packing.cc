#include "model/weight_packing.h"

#include <memory>
#include <string>
#include <vector>

#include "base/parallel_status.h"
#include "kernels/matmul_packed_bf16.h"
#include "model/layer_linear_weights.h"

namespace peerserve {
namespace {

struct Target {
  LinearWeight* weight;
  std::string name;
};

void add(std::vector<Target>& out, LinearWeight& w, std::string name) {
  if (w.data != nullptr && !w.int8 && !w.bf16_packed) out.push_back({&w, std::move(name)});
}

// An MLP quantized to INT8 runs its gate and up through the fused form only: they are not
// packed (their int8 member stays empty, so add() alone would take them).
MlpVisitor skip_fused_int8(std::vector<Target>& out) {
  return [&out](MlpWeights& m, const std::string&) {
    if (!m.gate_up_int8) return;
    std::erase_if(out, [&](const Target& t) { return t.weight == &m.gate || t.weight == &m.up; });
  };
}

// Every weight of the layer the forward multiplies (kv_b too: the prefill decompresses the
// context with it).
void add_layer(std::vector<Target>& out, DecoderLayerWeights& layer) {
  for_each_layer_linear(
      layer, "layer " + std::to_string(layer.index),
      [&](LinearWeight& w, const std::string& name) { add(out, w, name); }, skip_fused_int8(out));
}

Status pack_one(const Target& target, const std::function<void(const LinearWeight&)>& packed_fn) {
  LinearWeight& w = *target.weight;
  PS_RETURN_IF_ERROR(pack_linear_bf16(w).with_context("packing " + target.name));
  if (packed_fn) packed_fn(w);
  return ok_status();
}

}  // namespace

Status pack_linear_bf16(LinearWeight& w) {
  auto packed = kernels::PackedBf16Matrix::pack({w.data, w.rows, w.cols, 0});
  if (!packed.ok()) return packed.status();
  w.bf16_packed = std::make_shared<const kernels::PackedBf16Matrix>(std::move(packed).value());
  return ok_status();
}

bool packs_bf16_weights(const ModelOptions& options) {
  return options.pack_bf16 && options.gemm_precision == GemmPrecision::kBf16 &&
         kernels::packed_bf16_is_fast();
}

Status pack_mlp_bf16(MlpWeights& mlp) {
  std::vector<Target> targets;
  for_each_mlp_linear(
      mlp, "expert", [&](LinearWeight& w, const std::string& name) { add(targets, w, name); },
      skip_fused_int8(targets));
  for (const Target& target : targets) PS_RETURN_IF_ERROR(pack_one(target, {}));
  return ok_status();
}

Status pack_absorbed_attention_bf16(DeepseekWeights& weights, const ModelConfig& config,
                                    ThreadPool* pool) {
  const int64_t heads = config.num_attention_heads, nope = config.qk_nope_head_dim;
  const int64_t v = config.v_head_dim, lora = config.kv_lora_rank;
  std::vector<AttentionWeights*> layers;
  for (DecoderLayerWeights& layer : weights.layers) layers.push_back(&layer.attention);
  if (weights.mtp) layers.push_back(&weights.mtp->layer.attention);
  for (AttentionWeights* a : layers) {
    if (a->kv_b.data == nullptr || a->kv_b.rows != heads * (nope + v) || a->kv_b.cols != lora ||
        static_cast<int64_t>(a->w_uk_t.size()) != heads * lora * nope) {
      return internal_error("packing the absorbed attention: kv_b is not [" +
                            std::to_string(heads * (nope + v)) + ", " + std::to_string(lora) +
                            "] with its W_UK copy");
    }
    a->w_uk_packed.assign(static_cast<size_t>(heads), nullptr);
    a->w_uv_packed.assign(static_cast<size_t>(heads), nullptr);
  }
  const int64_t per_layer = 2 * heads;
  PS_RETURN_IF_ERROR(parallel_for_each(
      pool, static_cast<int64_t>(layers.size()) * per_layer, [&](int64_t i) -> Status {
        AttentionWeights& a = *layers[static_cast<size_t>(i / per_layer)];
        const int64_t h = (i % per_layer) / 2;
        const bool uk = i % 2 == 0;
        const kernels::MatrixView<bf16> view =
            uk ? kernels::MatrixView<bf16>{a.w_uk_t.data() + h * lora * nope, lora, nope, 0}
               : kernels::MatrixView<bf16>{a.kv_b.data + (h * (nope + v) + nope) * lora, v, lora,
                                           0};
        auto packed = kernels::PackedBf16Matrix::pack(view);
        if (!packed.ok()) {
          return packed.status().with_context("packing the absorbed attention's head " +
                                              std::to_string(h));
        }
        (uk ? a.w_uk_packed : a.w_uv_packed)[static_cast<size_t>(h)] =
            std::make_shared<const kernels::PackedBf16Matrix>(std::move(packed).value());
        return ok_status();
      }));
  for (AttentionWeights* a : layers) std::vector<bf16>().swap(a->w_uk_t);
  return ok_status();
}

Status pack_weights_bf16(DeepseekWeights& weights, ThreadPool* pool,
                         const std::function<void(const LinearWeight&)>& packed_fn) {
  std::vector<Target> targets;
  for (DecoderLayerWeights& layer : weights.layers) add_layer(targets, layer);
  if (weights.mtp) {
    add(targets, weights.mtp->eh_proj, "mtp eh_proj");
    add_layer(targets, weights.mtp->layer);
    add(targets, weights.mtp->head, "mtp shared_head");
  }
  add(targets, weights.lm_head, "lm_head");
  return parallel_for_each(pool, static_cast<int64_t>(targets.size()), [&](int64_t i) {
    return pack_one(targets[static_cast<size_t>(i)], packed_fn);
  });
}

}  // namespace peerserve
