// The routed-expert weights a rank needs for an expert placement, read from the checkpoint
// on demand (zero-copy views of the mapping for BF16, dequantized once for FP8), prepared
// once as the model prepares its own weights (INT8 at load, packed BF16:
// DeepseekModel::prepare_routed_expert) and shared between placements, so that a rebalance
// reads only the experts a rank newly holds.
//
// Thread-safety: one thread (the rank's engine thread) loads and trims; a returned Set is
// immutable and may be read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "dist/expert_placement.h"
#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_weights.h"

namespace peerserve::dist {

class ExpertWeightsStore {
 public:
  // The experts of one rank under one placement: by_layer[decoder layer] in the rank's slot
  // order (empty for layers without routed experts).
  struct Set {
    std::vector<std::vector<MlpWeights>> by_layer;
    std::vector<std::span<const MlpWeights>> spans() const;
  };

  static Result<std::unique_ptr<ExpertWeightsStore>> open(const std::string& model_dir);

  // Called once per expert read, before it is cached: adds the forms the forward multiplies
  // (may add a packed BF16 copy, after which the checkpoint's pages of it are dropped; after
  // an INT8 form, the weight's BF16 form is dropped too).
  using Prepare = std::function<Status(int64_t layer, MlpWeights&)>;

  // `rank`'s experts under `placement`, for decoder layers [0, num_layers) (include the MTP
  // layer's index when it runs). Errors name the expert that could not be read or prepared.
  Result<std::shared_ptr<const Set>> load(const ExpertPlacement& placement, int rank,
                                          int64_t num_layers, const Prepare& prepare = {});
  // Forgets cached experts that `keep` does not hold (their memory goes once no Set uses it).
  void trim(const Set& keep);

  // Experts read from the checkpoint so far (a cached expert is read once).
  int64_t experts_read() const { return experts_read_; }

 private:
  explicit ExpertWeightsStore(Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}

  Checkpoint checkpoint_;
  std::map<std::pair<int64_t, int>, MlpWeights> cache_;  // (layer, logical expert)
  int64_t experts_read_ = 0;
};

}  // namespace peerserve::dist
