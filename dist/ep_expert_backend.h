// ExpertBackend over expert parallelism: the routed experts are sharded over the ranks of a
// Communicator (ExpertPlacement), and each call exchanges tokens with FusedDispatch /
// FusedCombine (expert_dispatch.h).
//
//   dispatch: route each (token, j) to a copy of its logical expert and write the tokens
//             into the owners' buffers;
//   compute:  wait for every rank's tokens, group them by local expert, run gate/up and
//             down as grouped bf16 GEMMs (as LocalExpertBackend does), send each output row
//             back to its source;
//   combine:  wait for every owner's rows and sum them in top-k order.
// With DispatchDtype::kFp32 the result is bitwise that of LocalExpertBackend over all
// experts (the GEMMs are row-wise batch-invariant and the final sum is the same fma
// sequence); int8/bf16 dispatch round the tokens, and results travel as bf16.
//
// collective() is true: every rank must make every call, in the same order, with zero
// tokens if it has none. A peer that does not arrive within the timeout makes the call
// fail with Unavailable naming it; the group is then unusable.
//
// Memory is allocated at creation (window, staging, GEMM scratch for the worst case); a
// call allocates nothing. Thread-safety: one thread drives the backend; calls of slot 0
// and slot 1 may interleave, but compute() runs one at a time (shared GEMM scratch).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "dist/communicator.h"
#include "dist/expert_dispatch.h"
#include "dist/expert_placement.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "model/deepseek_weights.h"
#include "model/expert_backend.h"
#include "model/forward_step.h"

namespace peerserve::dist {

struct EpExpertBackendOptions {
  Communicator* communicator = nullptr;  // must outlive the backend
  ExpertPlacement placement;             // placement.num_ranks() == communicator->size()
  // [decoder layer] -> this rank's physical experts of that layer, in local slot order
  // (placement.local_experts(layer, rank)); empty for layers without routed experts. The
  // weights must outlive the backend.
  std::vector<std::span<const MlpWeights>> local_experts_by_layer;
  DispatchDtype dispatch_dtype = DispatchDtype::kInt8;
  int max_tokens_per_rank = 0;  // per call; sizes the buffers (eq. 1-2)
  int64_t hidden_size = 0;
  int top_k = 0;
  kernels::ActivationPrecision precision = kernels::ActivationPrecision::kFp32;
  ThreadPool* pool = nullptr;  // GEMM threads; nullptr = the calling thread
  std::chrono::milliseconds peer_timeout{60000};
  bool direct_stores = true;  // ExchangeShape::direct_stores (false: always put)
};

class EpExpertBackend final : public ExpertBackend {
 public:
  // Collective (creates the exchange window on every rank). Errors name the option that
  // does not fit (weights of a layer vs the placement, sizes).
  static Result<std::unique_ptr<EpExpertBackend>> create(EpExpertBackendOptions options);

  std::unique_ptr<Call> new_call(int slot) override;
  Status dispatch(const RoutedTokens& tokens, Call& call) override;
  Status compute(Call& call) override;
  Status combine(Call& call, std::span<float> out) override;
  // compute waits for every rank's dispatch, combine for every owner's results: ready when
  // they are already here (one look at the flags), so a pipeline driver can run the other
  // microbatch meanwhile.
  bool ready(const Call& call) const override;
  bool collective() const override { return true; }

  const ExpertExchange& exchange() const { return *exchange_; }
  // ExpertExchange::last_dispatch_load and count_experts_up_to.
  ExpertExchange::DispatchLoad last_dispatch_load() const {
    return exchange_->last_dispatch_load();
  }
  void count_experts_up_to(int64_t max_tokens) { exchange_->count_experts_up_to(max_tokens); }
  // The coming step, as the ranks agreed on it (ExpertExchange::set_step).
  void set_step(int ranks_with_tokens, int64_t step_tokens) {
    exchange_->set_step(ranks_with_tokens, step_tokens);
  }

  // Use create().
  EpExpertBackend(EpExpertBackendOptions options, std::unique_ptr<ExpertExchange> exchange,
                  int64_t max_intermediate);

 private:
  EpExpertBackendOptions options_;
  std::unique_ptr<ExpertExchange> exchange_;
  // GEMM scratch for the most rows an owner can receive: ranks x max pairs per peer.
  std::vector<float> x_, gate_, up_, down_;
  std::vector<int32_t> row_source_, row_pair_;
  std::vector<int64_t> first_row_, next_row_;  // per local slot
  // The BF16 expert GEMMs of compute() over the gathered rows.
  Status compute_bf16(std::span<const MlpWeights> experts, int64_t rows, int64_t inter);

  std::vector<LinearProblem> problems_;
  // W8A8 experts (an INT8 checkpoint or --quantize int8): fused gate/up/SiLU, then down.
  std::vector<kernels::GateUpInt8Args> gate_up_int8_;
  std::vector<kernels::MatmulInt8Args> down_int8_;
};

}  // namespace peerserve::dist
