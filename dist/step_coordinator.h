// StepCoordinator: the lock-step agreement of data-parallel ranks under expert parallelism.
//
// Every rank owns its own requests, but every MoE layer's exchange needs every rank. So
// before each step the ranks agree (one small allreduce) on whether anyone has work; if
// anyone has, every rank steps, the idle ones with zero tokens (a dummy step), and nobody
// waits for a peer that is not coming. The agreement also carries the step number, so that
// periodic decisions (an expert rebalance every N steps) happen on every rank at the same
// step, and a stop request (the leader is done) ends every rank's loop together.
//
// An agreement can carry mail: each rank may post bytes, and every rank receives every
// rank's bytes of that agreement (the data-parallel front end sends requests to the ranks
// and gets their outputs back this way). Without mail an agreement is one allgather of five
// numbers per rank; with mail, one more allgather of the longest letter, padded.
//
// Thread-safety: the thread that owns the Communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"

namespace peerserve::dist {

struct StepAgreement {
  bool step = false;  // at least one rank has work: everyone runs this step
  bool stop = false;  // a rank asked the group to stop (after this agreement)
  int64_t ranks_with_work = 0;
  int64_t tokens = 0;      // rows all ranks bring to this step, summed
  int64_t step_index = 0;  // steps agreed so far (the same on every rank)
  // Rank 0's `proposal` to this agreement: a decision every rank follows (the microbatch
  // plan of runtime/microbatch_policy.h).
  uint64_t leader_proposal = 0;
  // mail[r]: the bytes rank r posted to this agreement (empty when it posted none, or when
  // no rank posted any: then mail is empty altogether).
  std::vector<std::vector<std::byte>> mail;
};

class StepCoordinator {
 public:
  // `timeout` bounds each agreement: a rank that does not arrive (dead, or stuck) turns into
  // Unavailable naming it. The communicator must outlive the coordinator.
  StepCoordinator(Communicator* comm, std::chrono::milliseconds timeout)
      : comm_(comm), timeout_(timeout) {}

  // Called by every rank once per loop iteration: `tokens` is the rows this rank would run
  // (0 when idle), `stop` asks the whole group to end, `mail` goes to every rank (at most
  // kMaxMailBytes; more is InvalidArgument on this rank, before any communication),
  // `proposal` counts only from rank 0 (StepAgreement::leader_proposal).
  Result<StepAgreement> agree(int64_t tokens, bool stop = false,
                              std::span<const std::byte> mail = {}, uint64_t proposal = 0);

  static constexpr size_t kMaxMailBytes = size_t{256} << 20;

  int64_t steps() const { return steps_; }

 private:
  Communicator* comm_;
  std::chrono::milliseconds timeout_;
  int64_t steps_ = 0;
  std::vector<int64_t> numbers_;
};

}  // namespace peerserve::dist
