// The ReplicatedWeightsBackend seam: how the forward runs the products whose weights every
// process holds whole: the attention projections, the dense layers' MLP, the MoE layers'
// shared expert and the LM head.
//
// Without a backend (one process) the model runs them itself. Under expert parallelism
// attention is data-parallel, so at a small batch one rank may bring the only request and
// stream these weights alone while its peers wait at the next exchange;
// dist/tensor_parallel_backend.h installs a backend that splits them over the ranks
// (tensor parallel) when every rank brings few rows, and declines otherwise.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "model/forward_step.h"

namespace peerserve {

// The single-input products a backend may take.
enum class ReplicatedProjection : uint8_t {
  kAttentionDown,     // x_norm -> q_a (or q_proj without q_lora_rank) and kv_a: out = {q, kv}
  kAttentionQueryUp,  // normed q_a -> q_b: out = {q}
  kAttentionOutput,   // attention output -> o_proj: out = {y}
  kLmHead,            // final-normed hidden rows -> the main model's LM head: out = {logits}
};

class ReplicatedWeightsBackend {
 public:
  virtual ~ReplicatedWeightsBackend() = default;

  // Every call below either computes what the model would, bit for bit, into the outputs
  // and returns true, or returns false without writing them (then the model computes it).
  // Collective: in a step whose stages are not interleaved with another microbatch's,
  // every rank makes every call of every decoder layer in the same order, with zero rows
  // if it has none; every rank gets the same answer. An error (a lost peer) ends the step.

  // out[rows, hidden] = the dense MLP or shared expert of decoder layer `layer` (x:
  // [rows, hidden]).
  virtual Result<bool> run_mlp(const ComputeContext& ctx, int64_t layer, const float* x,
                               int64_t rows, float* out) = 0;
  // A run_mlp that returned true may complete `out` only here: an MoE layer's shared expert
  // may run on another rank while this one goes on with its routed experts. The model calls
  // this before it reads that output; the backend's next call completes it too.
  virtual Status finish_mlp() { return ok_status(); }
  // out[j][rows, W_j.rows] = x[rows, W_j.cols] W_j^T for the weights W_j of `which` at decoder
  // layer `layer` (dense outputs); `layer` is ignored for kLmHead (called once per step,
  // after the last layer).
  virtual Result<bool> run_projection(const ComputeContext& ctx, int64_t layer,
                                      ReplicatedProjection which, const float* x, int64_t rows,
                                      std::span<float* const> out) = 0;
};

}  // namespace peerserve
