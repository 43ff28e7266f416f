// ExpertBackend that runs the routed experts on this machine.
//
// dispatch groups the (token, expert) pairs by expert and gathers each expert's tokens
// into a contiguous block; compute runs gate and up for all experts in one grouped GEMM,
// silu(gate) * up, then down in a second grouped GEMM; combine sums each token's expert
// outputs times their weights in top-k order. Every step is row-wise, so results are
// batch-invariant.
//
// The backend itself holds only immutable weights views; all scratch lives in its Call
// objects, so several calls (microbatches) may be in flight. The kernels of one call use
// the pool, so stages of different calls must not run at the same time on one pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "model/deepseek_weights.h"
#include "model/expert_backend.h"

namespace peerserve {

// The routed experts of one layer that this process holds.
struct HeldExperts {
  std::span<const MlpWeights> weights;  // empty for dense layers
  // Logical expert id of weights[i]; empty means weights[i] is expert i (all are held).
  std::vector<int32_t> logical_ids;
};

class LocalExpertBackend final : public ExpertBackend {
 public:
  // experts_by_layer[layer] are all the routed experts of that layer, in id order (empty
  // for dense layers). The weights and the pool must outlive the backend.
  LocalExpertBackend(std::vector<std::span<const MlpWeights>> experts_by_layer,
                     kernels::ActivationPrecision precision, ThreadPool* pool);
  // Only some experts per layer (expert parallelism: this rank's share). A token routed to
  // an expert that is not held is an InvalidArgument naming it.
  LocalExpertBackend(std::vector<HeldExperts> held_by_layer, kernels::ActivationPrecision precision,
                     ThreadPool* pool);

  std::unique_ptr<Call> new_call(int slot) override;
  Status dispatch(const RoutedTokens& tokens, Call& call) override;
  Status compute(Call& call) override;
  Status combine(Call& call, std::span<float> out) override;

 private:
  std::vector<std::span<const MlpWeights>> experts_by_layer_;
  // Per layer: index into experts_by_layer_[layer] of each logical expert id, -1 if not held.
  std::vector<std::vector<int32_t>> index_of_logical_;
  kernels::ActivationPrecision precision_;
  ThreadPool* pool_;
};

}  // namespace peerserve
