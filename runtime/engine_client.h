// EngineClient: what a front end (the OpenAI server) needs from whatever runs its requests.
//
// Two implementations: Engine (this process's engine) and DataParallelRouter (rank 0 of an
// expert-parallel job, spreading requests over the engines of every rank). The front end
// does not know which one it talks to.
//
// Thread-safety: every method may be called from any thread. Output sinks are called on an
// engine thread, must not block and must not call submit().
#pragma once

#include <functional>

#include "base/status.h"
#include "runtime/engine_metrics.h"
#include "runtime/request.h"

namespace peerserve {

struct EngineOptions;

class EngineClient {
 public:
  using OutputSink = std::function<void(RequestOutput)>;

  virtual ~EngineClient() = default;

  // Queues a request; see Engine::submit for the errors.
  virtual Result<RequestId> submit(EngineRequest request, OutputSink sink) = 0;
  // Ends a request early (its sink gets a last kAbort output unless it already finished).
  virtual void abort(RequestId id) = 0;
  // The options every engine behind this client runs with.
  virtual const EngineOptions& options() const = 0;
  // The most sequences the waiting queues behind this client hold together: a request of
  // more can never be queued (a 400, where a full queue is a 429 to retry).
  virtual int64_t waiting_capacity() const = 0;
  virtual EngineMetricsSnapshot metrics() const = 0;
  virtual bool running() const = 0;
};

}  // namespace peerserve
