// StepCoordinator: the lock-step agreement of data-parallel ranks under expert parallelism.
//
// Every rank owns its own requests, but every MoE layer's exchange needs every rank. So
// before each step the ranks agree (one small allreduce) on whether anyone has work; if
// anyone has, every rank steps, the idle ones with zero tokens (a dummy step), and nobody
// waits for a peer that is not coming. The agreement also carries the step number, so that
// periodic decisions (an expert rebalance every N steps) happen on every rank at the same
// step, and a stop request (the leader is done) ends every rank's loop together.
//
// Thread-safety: the thread that owns the Communicator.
#pragma once

#include <chrono>
#include <cstdint>

#include "base/status.h"
#include "dist/communicator.h"

namespace peerserve::dist {

struct StepAgreement {
  bool step = false;  // at least one rank has work: everyone runs this step
  bool stop = false;  // a rank asked the group to stop (after this agreement)
  int64_t ranks_with_work = 0;
  int64_t tokens = 0;      // rows all ranks bring to this step, summed
  int64_t step_index = 0;  // steps agreed so far (the same on every rank)
};

class StepCoordinator {
 public:
  // `timeout` bounds each agreement: a rank that does not arrive (dead, or stuck) turns into
  // Unavailable naming it. The communicator must outlive the coordinator.
  StepCoordinator(Communicator* comm, std::chrono::milliseconds timeout)
      : comm_(comm), timeout_(timeout) {}

  // Called by every rank once per loop iteration: `tokens` is the rows this rank would run
  // (0 when idle), `stop` asks the whole group to end.
  Result<StepAgreement> agree(int64_t tokens, bool stop = false);

  int64_t steps() const { return steps_; }

 private:
  Communicator* comm_;
  std::chrono::milliseconds timeout_;
  int64_t steps_ = 0;
};

}  // namespace peerserve::dist
