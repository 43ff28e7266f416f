#include "dist/expert_weights_store.h"

#include <set>
#include <string>

namespace peerserve::dist {

std::vector<std::span<const MlpWeights>> ExpertWeightsStore::Set::spans() const {
  std::vector<std::span<const MlpWeights>> out;
  out.reserve(by_layer.size());
  for (const auto& layer : by_layer) out.emplace_back(layer);
  return out;
}

Result<std::unique_ptr<ExpertWeightsStore>> ExpertWeightsStore::open(const std::string& model_dir) {
  PS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(model_dir));
  return std::unique_ptr<ExpertWeightsStore>(new ExpertWeightsStore(std::move(checkpoint)));
}

Result<std::shared_ptr<const ExpertWeightsStore::Set>> ExpertWeightsStore::load(
    const ExpertPlacement& placement, int rank, int64_t num_layers, const Prepare& prepare) {
  auto set = std::make_shared<Set>();
  set->by_layer.resize(num_layers);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    if (!placement.has_layer(layer)) continue;
    for (const int expert : placement.local_experts(layer, rank)) {
      auto it = cache_.find({layer, expert});
      if (it == cache_.end()) {
        PS_ASSIGN_OR_RETURN(MlpWeights weights, load_routed_expert(checkpoint_, layer, expert));
        if (prepare) {
          PS_RETURN_IF_ERROR(prepare(layer, weights)
                                 .with_context("layer " + std::to_string(layer) + " expert " +
                                               std::to_string(expert)));
          const bool fused_int8 = weights.gate_up_int8 != nullptr;
          for (LinearWeight* w : {&weights.gate, &weights.up, &weights.down}) {
            // The packed or INT8 copy is what the kernels read (as in DeepseekModel::load).
            const bool int8 = w->int8 != nullptr || (fused_int8 && w != &weights.down);
            if (w->bf16_packed || int8) {
              checkpoint_.release_pages(w->data,
                                        static_cast<size_t>(w->rows * w->cols) * sizeof(*w->data));
            }
            // An INT8 weight keeps no BF16 form, as at load (quantize_weights_int8): for an
            // FP8 checkpoint that form is a converted copy, which releasing pages leaves.
            if (int8) drop_bf16_form(*w);
          }
        }
        it = cache_.emplace(std::make_pair(layer, expert), std::move(weights)).first;
        ++experts_read_;
      }
      set->by_layer[layer].push_back(it->second);
    }
  }
  return std::shared_ptr<const Set>(std::move(set));
}

namespace {

// What tells two held experts apart: their BF16 storage, or (stored INT8) their packed form.
const void* identity(const MlpWeights& w) {
  return w.gate.data != nullptr ? static_cast<const void*>(w.gate.data)
                                : static_cast<const void*>(w.gate_up_int8.get());
}

}  // namespace

void ExpertWeightsStore::trim(const ExpertWeightsStore::Set& keep) {
  std::set<std::pair<int64_t, const void*>> held;
  for (size_t layer = 0; layer < keep.by_layer.size(); ++layer) {
    for (const MlpWeights& w : keep.by_layer[layer]) {
      held.insert({static_cast<int64_t>(layer), identity(w)});
    }
  }
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (held.count({it->first.first, identity(it->second)}) == 0) {
      it = cache_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace peerserve::dist
