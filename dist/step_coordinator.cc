#include "dist/step_coordinator.h"

namespace peerserve::dist {

Result<StepAgreement> StepCoordinator::agree(int64_t tokens, bool stop) {
  // Sum of: ranks with work, tokens, stop requests.
  int64_t values[3] = {tokens > 0 ? 1 : 0, tokens, stop ? 1 : 0};
  PS_RETURN_IF_ERROR(comm_->allreduce(values, ReduceOp::kSum, timeout_));
  StepAgreement agreement;
  agreement.ranks_with_work = values[0];
  agreement.tokens = values[1];
  agreement.stop = values[2] > 0;
  agreement.step = values[0] > 0;
  agreement.step_index = steps_;
  if (agreement.step) ++steps_;
  return agreement;
}

}  // namespace peerserve::dist
