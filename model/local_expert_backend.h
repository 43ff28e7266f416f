// ExpertBackend that runs the routed experts on this machine.
//
// A call groups the (token, expert) pairs by expert, gathers each expert's tokens into a
// contiguous block, runs gate and up for all experts in one grouped GEMM, silu(gate) * up,
// then down in a second grouped GEMM, and finally sums each token's expert outputs times
// their weights in top-k order. Every step is row-wise, so results are batch-invariant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "model/deepseek_weights.h"
#include "model/expert_backend.h"

namespace peerserve {

class LocalExpertBackend final : public ExpertBackend {
 public:
  // experts_by_layer[layer] are the routed experts of that layer (empty for dense layers).
  // The weights and the pool must outlive the backend. Not thread-safe (scratch buffers).
  LocalExpertBackend(std::vector<std::span<const MlpWeights>> experts_by_layer,
                     kernels::ActivationPrecision precision, ThreadPool* pool);

  Status run(const RoutedTokens& tokens, std::span<float> out) override;

 private:
  std::vector<std::span<const MlpWeights>> experts_by_layer_;
  kernels::ActivationPrecision precision_;
  ThreadPool* pool_;
  std::vector<float> x_, gate_, up_, down_;
  std::vector<int64_t> slot_of_pair_;
};

}  // namespace peerserve
