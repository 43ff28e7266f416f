// Executor: runs one StepPlan (the model forward over the planned chunks, then sampling of
// the chunks that end a sequence's known tokens). The engine owns one; tests use fakes and
// the planner a simulated one.
#pragma once

#include "base/status.h"
#include "runtime/step_plan.h"

namespace peerserve {

class Executor {
 public:
  virtual ~Executor() = default;
  // Fills one StepResult entry per chunk (a token where chunk.sample). An error fails every
  // sequence of the plan; the KV written by a failed step is never published.
  virtual Result<StepResult> execute(const StepPlan& plan) = 0;
};

}  // namespace peerserve
