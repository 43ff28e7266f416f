// The ExpertBackend seam: how an MoE layer hands its routed experts to an executor.
//
// The model routes tokens (router scores, top-k selection, weights) and then asks "run
// these tokens through these experts of layer L with these weights". LocalExpertBackend
// (local_expert_backend.h) runs them on this machine with grouped GEMMs; an
// expert-parallel backend (dist/ep_expert_backend.h) sends them to the ranks that own the
// experts and combines the answers. Shared experts are not part of the seam (every rank
// runs them locally).
//
// A call is split into dispatch, compute and combine so that a caller can overlap the
// exchange of one microbatch with other work; run() does the three in order. Per-call
// state lives in a caller-owned Call, one per microbatch slot.
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
  std::span<const int32_t> expert_ids;  // [num_tokens, top_k] LOGICAL ids, distinct per token
  std::span<const float> weights;       // [num_tokens, top_k], already normalised and scaled
};

class ExpertBackend {
 public:
  // Per-microbatch state, owned by the caller and reused across steps.
  class Call {
   public:
    virtual ~Call() = default;
  };

  virtual ~ExpertBackend() = default;

  // A Call for microbatch `slot` (0 or 1). Two calls of different slots may be in flight
  // at once.
  virtual std::unique_ptr<Call> new_call(int slot);
  // Starts the call; the spans of `tokens` must stay valid until combine returns.
  virtual Status dispatch(const RoutedTokens& tokens, Call& call);
  // Runs the experts this process owns.
  virtual Status compute(Call& call);
  // out[t, :] = sum over j = 0 .. top_k-1, in that order, of
  //   weights[t, j] * expert_{expert_ids[t, j]}(activations[t, :]),
  // where expert(x) = down(silu(gate(x)) * up(x)). out is [num_tokens, hidden_size] and is
  // overwritten. The value of row t must depend only on row t of the inputs (batch
  // invariance), so that a batch equals its tokens run one by one.
  virtual Status combine(Call& call, std::span<float> out);
  // True when every rank must join every call, with zero tokens if it has none.
  virtual bool collective() const { return false; }

  // dispatch + compute + combine.
  Status run(const RoutedTokens& tokens, Call& call, std::span<float> out) {
    PS_RETURN_IF_ERROR(dispatch(tokens, call));
    PS_RETURN_IF_ERROR(compute(call));
    return combine(call, out);
  }

  // Transitional: the one-shot form that backends written before the split implement (the
  // four methods above then default to it); a split backend gets it for free.
  virtual Status run(const RoutedTokens& tokens, std::span<float> out) {
    std::unique_ptr<Call> call = new_call(0);
    return run(tokens, *call, out);
  }

 private:
  struct OneShotCall final : Call {
    RoutedTokens tokens;
  };
};

inline std::unique_ptr<ExpertBackend::Call> ExpertBackend::new_call(int /*slot*/) {
  return std::make_unique<OneShotCall>();
}
inline Status ExpertBackend::dispatch(const RoutedTokens& tokens, Call& call) {
  static_cast<OneShotCall&>(call).tokens = tokens;
  return ok_status();
}
inline Status ExpertBackend::compute(Call& /*call*/) {
  return ok_status();
}
inline Status ExpertBackend::combine(Call& call, std::span<float> out) {
  return run(static_cast<OneShotCall&>(call).tokens, out);
}

}  // namespace peerserve
