// The ExpertBackend seam: how an MoE layer hands its routed experts to an executor.
//
// The model routes tokens (router scores, top-k selection, weights) and then asks "run
// these tokens through these experts of layer L with these weights". LocalExpertBackend
// (local_expert_backend.h) runs them on this machine with grouped GEMMs; an
// expert-parallel backend (dist/) sends them to the ranks that own the experts and
// combines the answers. Shared experts are not part of the seam (every rank runs them
// locally, between dispatch and combine, to hide the exchange).
//
// A call runs in three stages that the model starts separately, so that other work (the
// shared expert, or the attention of another microbatch) can run between them:
//
//   dispatch(tokens, call)  hand the tokens to the experts' owners (EP: write them into
//                           the owners' receive buffers)
//   compute(call)           run the experts this process owns on what it received
//   combine(call, out)      gather the expert outputs of this process's tokens and sum
//                           them in top-k order into out
//
// The per-call state lives in a Call object that the caller owns (one per microbatch in
// flight, made once by new_call and reused for every layer and step), never in the
// backend, so two microbatches can be in flight at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"

namespace peerserve {

// Tokens of one MoE layer, each routed to top_k experts.
struct RoutedTokens {
  int64_t layer = 0;  // decoder layer index (the MTP layer is num_hidden_layers)
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int64_t top_k = 0;
  std::span<const float> activations;   // [num_tokens, hidden_size], post-attention-norm
  std::span<const int32_t> expert_ids;  // [num_tokens, top_k] logical ids, distinct per token
  std::span<const float> weights;       // [num_tokens, top_k], already normalised and scaled
};

class ExpertBackend {
 public:
  // The state of one call in flight (scratch, received tokens, results). Opaque to the
  // caller; only the backend that made it may use it.
  class Call {
   public:
    virtual ~Call() = default;
  };

  virtual ~ExpertBackend() = default;

  // A fresh call state for microbatch `slot` (0 or 1: backends with double-buffered
  // receive buffers keep the two microbatches apart by it).
  virtual std::unique_ptr<Call> new_call(int slot) = 0;

  // Stage 1. The spans of `tokens` must stay valid until combine() returns.
  virtual Status dispatch(const RoutedTokens& tokens, Call& call) = 0;
  // Stage 2.
  virtual Status compute(Call& call) = 0;
  // Stage 3: out[t, :] = sum over j = 0 .. top_k-1, in that order, of
  //   weights[t, j] * expert_{expert_ids[t, j]}(activations[t, :]),
  // where expert(x) = down(silu(gate(x)) * up(x)). out is [num_tokens, hidden_size] and is
  // overwritten. The value of row t must depend only on row t of the inputs (batch
  // invariance), so that a batch equals its tokens run one by one.
  virtual Status combine(Call& call, std::span<float> out) = 0;

  // Whether the call's next stage (compute after dispatch, combine after compute) would run
  // without waiting for other processes. A pipeline driver asks this to run another
  // microbatch's stages meanwhile. Local backends never wait.
  virtual bool ready(const Call& /*call*/) const { return true; }

  // Whether every process of a group must take part in every call, with zero tokens if it
  // has none (expert parallelism: the owners wait for every peer's dispatch). The model
  // then runs every MoE layer of every step, empty steps included.
  virtual bool collective() const { return false; }

  // The three stages in a row.
  Status run(const RoutedTokens& tokens, Call& call, std::span<float> out);
};

}  // namespace peerserve
