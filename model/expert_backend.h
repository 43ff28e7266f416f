// The ExpertBackend seam: how an MoE layer hands its routed experts to an executor.
//
// The model routes tokens (router scores, top-k selection, weights) and then asks "run
// these tokens through these experts of layer L with these weights". LocalExpertBackend
// (local_expert_backend.h) runs them on this machine with grouped GEMMs; an
// expert-parallel backend sends them to the ranks that own the experts and combines the
// answers. Shared experts are not part of the seam (every rank runs them locally).
#pragma once

#include <cstdint>
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
  std::span<const int32_t> expert_ids;  // [num_tokens, top_k], distinct per token
  std::span<const float> weights;       // [num_tokens, top_k], already normalised and scaled
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;

  // out[t, :] = sum over j = 0 .. top_k-1, in that order, of
  //   weights[t, j] * expert_{expert_ids[t, j]}(activations[t, :]),
  // where expert(x) = down(silu(gate(x)) * up(x)). out is [num_tokens, hidden_size] and is
  // overwritten. The value of row t must depend only on row t of the inputs (batch
  // invariance), so that a batch equals its tokens run one by one.
  virtual Status run(const RoutedTokens& tokens, std::span<float> out) = 0;
};

}  // namespace peerserve
