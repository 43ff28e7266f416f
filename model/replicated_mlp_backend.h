// The ReplicatedMlpBackend seam: how the forward runs the MLPs every process holds whole,
// the dense layers' MLP and the MoE layers' shared expert.
//
// Without a backend (one process) the model runs them itself. Under expert parallelism
// attention is data-parallel, so at a small batch one rank may bring the only request and
// stream these weights alone while its peers wait at the next exchange;
// dist/split_mlp_backend.h installs a backend that splits them over the ranks (tensor
// parallel) when every rank brings few tokens, and declines otherwise.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "model/forward_step.h"

namespace peerserve {

class ReplicatedMlpBackend {
 public:
  virtual ~ReplicatedMlpBackend() = default;

  // out[rows, hidden] = the dense MLP or shared expert of decoder layer `layer` applied to
  // x[rows, hidden]; or false without touching out, and the model runs it itself.
  // Collective: in a step whose stages are not interleaved with another microbatch's,
  // every rank calls it for every dense and shared-expert MLP, in layer order, with zero
  // rows if it has none; every rank gets the same answer. An error (a lost peer) ends the
  // step.
  virtual Result<bool> run(const ComputeContext& ctx, int64_t layer, const float* x, int64_t rows,
                           float* out) = 0;
};

}  // namespace peerserve
