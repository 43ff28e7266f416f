// Which rank holds which routed experts: the logical -> physical expert map of every MoE
// layer for expert parallelism.
//
// A placement is plan::ExpertLayout (plan/placement/expert_layout.h, the planner's own type):
// num_ranks x slots_per_rank physical slots per layer, slot s on rank s / slots_per_rank,
// each holding one logical expert; an expert held by several slots is replicated
// (redundant experts, EPLB). This class indexes it by decoder layer for the dispatch path:
// the local experts of a rank (what it loads) and the copies of a logical expert (where a
// token may go). Immutable after creation; safe to share between threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "plan/placement/expert_layout.h"
#include "plan/placement/expert_routing_load.h"

namespace peerserve::dist {

struct PhysicalExpert {
  int rank = 0;
  int local_slot = 0;  // index among the rank's slots_per_rank experts of the layer
};

class ExpertPlacement {
 public:
  // Row i of `layout` places the experts of decoder layer moe_layers[i] (the MTP layer is
  // num_hidden_layers). Errors name the inconsistent field.
  static Result<ExpertPlacement> create(plan::ExpertLayout layout, std::vector<int> moe_layers);

  // Experts [r * E / ep, (r + 1) * E / ep) on rank r, no copies. InvalidArgument naming
  // --ep when ep does not divide num_experts.
  static Result<ExpertPlacement> contiguous(std::vector<int> moe_layers, int num_experts, int ep);

  // DeepSeek's EPLB (plan::eplb_placement, global policy) over `load`, with
  // `redundant_experts` extra slots per layer spread over the ranks: the hottest experts get
  // copies and the slots are packed so that rank loads balance. InvalidArgument when
  // num_experts + redundant_experts is not a multiple of ep.
  static Result<ExpertPlacement> balanced(const plan::ExpertRoutingLoad& load, int ep,
                                          int redundant_experts);

  int num_experts() const { return layout_.num_experts; }
  int num_ranks() const { return layout_.num_ranks; }
  int slots_per_rank() const { return layout_.slots_per_rank; }
  const plan::ExpertLayout& layout() const { return layout_; }
  std::span<const int> moe_layers() const { return moe_layers_; }

  // True if decoder layer `layer` has routed experts in this placement.
  bool has_layer(int64_t layer) const;
  // The logical expert of each of `rank`'s slots at `layer` (slots_per_rank entries): the
  // weights that rank loads, in slot order. REQUIRES: has_layer(layer).
  std::span<const int> local_experts(int64_t layer, int rank) const;
  // Copies of logical `expert` at `layer` (>= 1), in slot order. REQUIRES: has_layer(layer).
  std::span<const PhysicalExpert> copies(int64_t layer, int expert) const;

  // One layer's copies for a hot loop: the copies of expert e are
  // copies[begin[e] .. begin[e + 1]); `replicated` when some expert has more than one.
  struct LayerCopies {
    const PhysicalExpert* copies = nullptr;
    const int* begin = nullptr;  // num_experts + 1 entries
    bool replicated = false;
  };
  // REQUIRES: has_layer(layer).
  LayerCopies layer_copies(int64_t layer) const;

  ExpertPlacement() = default;  // empty: no layers, no ranks (use the factories)

 private:
  int row(int64_t layer) const;

  plan::ExpertLayout layout_;
  std::vector<int> moe_layers_;
  std::vector<int> row_of_layer_;  // decoder layer -> layout row, -1 for dense layers
  // Per row: copies of expert e are copies_[row][copy_begin_[row][e] .. copy_begin_[row][e+1]).
  std::vector<std::vector<int>> copy_begin_;
  std::vector<std::vector<PhysicalExpert>> copies_;
};

}  // namespace peerserve::dist
