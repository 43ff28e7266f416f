#include "dist/expert_placement.h"

#include <algorithm>
#include <string>

#include "plan/placement/eplb_placement.h"

namespace peerserve::dist {

Result<ExpertPlacement> ExpertPlacement::create(plan::ExpertLayout layout,
                                                std::vector<int> moe_layers) {
  PS_RETURN_IF_ERROR(layout.validate());
  if (moe_layers.size() != layout.physical_to_logical.size()) {
    return invalid_argument("expert placement: " + std::to_string(layout.num_layers()) +
                            " layout rows for " + std::to_string(moe_layers.size()) +
                            " MoE layers");
  }
  ExpertPlacement p;
  for (size_t i = 0; i < moe_layers.size(); ++i) {
    const int layer = moe_layers[i];
    if (layer < 0) {
      return invalid_argument("expert placement: MoE layer index " + std::to_string(layer) +
                              " is negative");
    }
    if (p.row_of_layer_.size() <= static_cast<size_t>(layer)) p.row_of_layer_.resize(layer + 1, -1);
    if (p.row_of_layer_[layer] != -1) {
      return invalid_argument("expert placement: MoE layer " + std::to_string(layer) +
                              " is listed twice");
    }
    p.row_of_layer_[layer] = static_cast<int>(i);
  }
  const int experts = layout.num_experts;
  for (const std::vector<int>& slots : layout.physical_to_logical) {
    std::vector<int> begin(experts + 1, 0);
    for (int e : slots) ++begin[e + 1];
    for (int e = 0; e < experts; ++e) begin[e + 1] += begin[e];
    std::vector<PhysicalExpert> copies(slots.size());
    std::vector<int> next(begin.begin(), begin.end() - 1);
    for (size_t s = 0; s < slots.size(); ++s) {
      copies[next[slots[s]]++] = {static_cast<int>(s) / layout.slots_per_rank,
                                  static_cast<int>(s) % layout.slots_per_rank};
    }
    p.copy_begin_.push_back(std::move(begin));
    p.copies_.push_back(std::move(copies));
  }
  p.layout_ = std::move(layout);
  p.moe_layers_ = std::move(moe_layers);
  return p;
}

Result<ExpertPlacement> ExpertPlacement::contiguous(std::vector<int> moe_layers, int num_experts,
                                                    int ep) {
  if (ep < 1 || num_experts < 1 || num_experts % ep != 0) {
    return invalid_argument("--ep " + std::to_string(ep) + " does not divide the " +
                            std::to_string(num_experts) +
                            " routed experts (use a divisor of the expert count)");
  }
  if (moe_layers.empty()) return invalid_argument("expert placement: the model has no MoE layers");
  PS_ASSIGN_OR_RETURN(
      plan::ExpertLayout layout,
      plan::contiguous_layout(static_cast<int>(moe_layers.size()), num_experts, ep));
  return create(std::move(layout), std::move(moe_layers));
}

Result<ExpertPlacement> ExpertPlacement::balanced(const plan::ExpertRoutingLoad& load, int ep,
                                                  int redundant_experts) {
  PS_RETURN_IF_ERROR(load.validate());
  const int physical = load.num_experts + redundant_experts;
  if (ep < 1 || redundant_experts < 0 || physical % ep != 0) {
    return invalid_argument("--ep " + std::to_string(ep) + " does not divide the " +
                            std::to_string(load.num_experts) + " routed + " +
                            std::to_string(redundant_experts) + " redundant experts");
  }
  plan::EplbOptions options;
  options.num_physical_experts = physical;
  options.num_gpus = ep;
  options.policy = plan::EplbPolicy::kGlobal;
  PS_ASSIGN_OR_RETURN(plan::ExpertLayout layout, plan::eplb_placement(load, options));
  return create(std::move(layout), load.moe_layers);
}

int ExpertPlacement::row(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(row_of_layer_.size())) return -1;
  return row_of_layer_[layer];
}

bool ExpertPlacement::has_layer(int64_t layer) const {
  return row(layer) >= 0;
}

std::span<const int> ExpertPlacement::local_experts(int64_t layer, int rank) const {
  const int r = row(layer);
  PS_CHECK(r >= 0 && rank >= 0 && rank < num_ranks()) << "layer " << layer << " rank " << rank;
  return std::span<const int>(layout_.physical_to_logical[r])
      .subspan(static_cast<size_t>(rank) * slots_per_rank(), slots_per_rank());
}

std::span<const PhysicalExpert> ExpertPlacement::copies(int64_t layer, int expert) const {
  PS_CHECK(expert >= 0 && expert < num_experts()) << "layer " << layer << " expert " << expert;
  const LayerCopies c = layer_copies(layer);
  return std::span<const PhysicalExpert>(c.copies + c.begin[expert],
                                         c.begin[expert + 1] - c.begin[expert]);
}

ExpertPlacement::LayerCopies ExpertPlacement::layer_copies(int64_t layer) const {
  const int r = row(layer);
  PS_CHECK(r >= 0) << "layer " << layer;
  LayerCopies c;
  c.copies = copies_[r].data();
  c.begin = copy_begin_[r].data();
  c.replicated = copies_[r].size() > static_cast<size_t>(num_experts());
  return c;
}

}  // namespace peerserve::dist
