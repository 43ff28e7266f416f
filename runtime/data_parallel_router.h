// DataParallelRouter: one OpenAI endpoint for an expert-parallel job.
//
//   mpirun -np N peerserve serve --ep N ...
//
// Attention is data-parallel: every rank runs its own engine with its own requests and KV
// cache, in lock-step with the others (dist/step_coordinator.h). Rank 0 answers the API and
// hands each request to the least loaded rank (fewest unfinished sequences, then fewest
// unfinished prompt tokens, then the lowest rank); its own engine is one of them. Requests
// and aborts travel to the ranks, and outputs back to rank 0, as mail on the lock-step
// agreement every rank makes before each step anyway, so no other channel is needed and a
// lost rank is the same error everywhere. A remote request's outputs reach rank 0 one
// agreement after its engine produced them.
//
// Each rank's engine calls lockstep() (EngineOptions::lockstep) on its engine thread.
// Rank 0 serves as the EngineClient of the OpenAI server: submit() checks the request with
// the engine's own validation (every rank runs the same options), so bad requests are
// answered at once. A rank gets a request only while its unfinished sequences (running
// included) stay within the waiting-queue limit, so its engine never refuses one rank 0
// accepted; when no other rank has room, rank 0's own engine takes or refuses it (429).
// When rank 0 is done it calls finish(): remote requests end with kAbort and the group
// stops; the other ranks learn it in lockstep() and wait_until_done() returns.
// When the group breaks (a rank lost), every remote request ends with the error, submit()
// refuses new ones, and wait_until_done() returns the error on every rank.
//
// /metrics counts the group: each other rank mails its engine's metrics and its expert load
// counts (set_expert_counts) along with its outputs, at least every kReportInterval (idle
// ranks keep agreeing every few ms, so also when idle) and on the agreement after one of its
// requests finished; metrics() and expert_counts() on rank 0 add the latest of every rank to
// its own.
//
// Thread-safety: submit(), abort(), metrics(), running(), outstanding(), wait_until_done()
// from any thread; lockstep() on the engine thread; finish() once, after this rank's
// engine stopped (it uses the communicator the engine thread used).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "dist/step_coordinator.h"
#include "grammar/token_constraint.h"
#include "runtime/engine.h"
#include "runtime/engine_client.h"

namespace peerserve {

class DataParallelRouter final : public EngineClient {
 public:
  // The group's agreement (EpSession::agree_and_rebalance, or a StepCoordinator in tests).
  using Agree = std::function<Result<dist::StepAgreement>(int64_t rows, bool stop,
                                                          std::span<const std::byte> mail)>;

  // `max_letter_bytes`: the most mail one agreement carries from this rank; what does not
  // fit waits for the next agreement (tests make it small).
  DataParallelRouter(int rank, int size, Agree agree,
                     size_t max_letter_bytes = dist::StepCoordinator::kMaxMailBytes);
  ~DataParallelRouter() override = default;
  DataParallelRouter(const DataParallelRouter&) = delete;
  DataParallelRouter& operator=(const DataParallelRouter&) = delete;

  // This rank's engine (created with lockstep bound to this router's lockstep()). Before
  // the engine starts; it must outlive every call into the router.
  void attach(Engine* engine);

  // How a rank turns a request's structured-output pattern (GenerationParams::
  // structured_output_pattern, which travels between ranks) back into its sampling
  // constraint. Before the engine starts. Without one, a request arriving with a pattern is
  // refused (InvalidArgument).
  using ConstraintCompiler =
      std::function<Result<std::shared_ptr<const grammar::TokenConstraint>>(const std::string&)>;
  void set_constraint_compiler(ConstraintCompiler compile) { compile_ = std::move(compile); }

  // This rank's selections per (layer, expert) since start, for /metrics (an empty vector:
  // none counted). Before the engine starts; called on the engine thread (other ranks) or
  // from metrics readers (rank 0), so it must be thread-safe.
  using ExpertCounts = std::function<std::vector<int64_t>()>;
  void set_expert_counts(ExpertCounts counts) { expert_counts_ = std::move(counts); }
  // Rank 0: every rank's expert counts summed (element-wise; empty when none are counted).
  std::vector<int64_t> expert_counts() const;

  // How often a stepping rank reports its metrics to rank 0 at the least.
  static constexpr std::chrono::milliseconds kReportInterval{250};

  // EngineOptions::lockstep: posts this rank's mail, agrees, delivers what arrived.
  Result<bool> lockstep(int64_t rows);

  // Rank 0, after its engine stopped: ends the remote requests with kAbort and stops the
  // group. A no-op when the group already broke or stopped.
  Status finish();

  // EngineOptions::lockstep_broken: this rank's engine gave the group up (a step failed):
  // remote requests end with the error and the group is done, as when a rank is lost.
  void break_group(const Status& why);

  // Every rank: blocks until the group stopped (ok) or broke (the error).
  Status wait_until_done();
  // Non-blocking: true once the group stopped or broke.
  bool done() const;

  // Rank 0: unfinished sequences on each rank, and requests handed to each rank so far.
  std::vector<int64_t> outstanding() const;
  std::vector<int64_t> routed_total() const;

  // EngineClient (rank 0 only).
  Result<RequestId> submit(EngineRequest request, OutputSink sink) override;
  void abort(RequestId id) override;
  const EngineOptions& options() const override { return engine_->options(); }
  // Every rank's queue: the prompts of one request are spread over the ranks.
  int64_t waiting_capacity() const override {
    return engine_->waiting_capacity() * static_cast<int64_t>(outstanding_seqs_.size());
  }
  // This rank's engine and the latest report of every other rank, summed.
  EngineMetricsSnapshot metrics() const override;
  bool running() const override;

 private:
  // A request of rank 0's client, wherever it runs.
  struct Routed {
    int rank = 0;
    int32_t n = 1;
    int64_t prompt_tokens = 0;
    RequestId engine_id = 0;  // the id in its rank's engine (rank 0's own engine only)
    OutputSink sink;
    std::vector<bool> choice_finished;
    bool abort_requested = false;
  };
  // A request another rank's front end handed to this rank's engine.
  struct Hosted {
    RequestId engine_id = 0;
  };

  Result<bool> lead(int64_t rows);
  Result<bool> follow(int64_t rows);
  // Compiles the structured-output pattern a request arrived with into its constraint.
  Status attach_constraint(EngineRequest& request) const;
  // Hands one output of request `id`, made by rank `from_rank`'s engine, to its sink (called
  // on rank 0's engine thread). DataLoss, and nothing delivered, when that rank does not host
  // the request or a choice index is outside [0, n): a corrupt message from another rank.
  Status deliver(int from_rank, RequestId id, RequestOutput output);
  void release(RequestId id);  // under mutex_
  void end_remote(FinishReason reason, const Status& error);
  void mark_done(Status status);

  const int rank_;
  const int size_;
  Agree agree_;
  Engine* engine_ = nullptr;
  ConstraintCompiler compile_;

  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  Status done_status_;
  // Rank 0.
  RequestId next_id_ = 1;
  std::unordered_map<RequestId, Routed> routed_;
  std::vector<int64_t> outstanding_seqs_;
  std::vector<int64_t> outstanding_tokens_;
  std::vector<int64_t> routed_total_;
  // Encoded records for the next agreements, and where each ends. A letter takes the
  // leading records that fit max_letter_bytes_; the rest waits for the next agreement (a
  // burst of long prompts during a long step must not exceed what one agreement carries).
  struct Outbox {
    std::vector<std::byte> body;
    std::vector<size_t> ends;
  };
  // The next letter: a count, then the leading records that fit (one record alone goes
  // even if it does not: the agreement then refuses it). Empty when there is nothing.
  std::vector<std::byte> take_letter(Outbox* box) const;
  const size_t max_letter_bytes_;
  Outbox commands_;  // submits and aborts
  // The latest report of each rank (index 0 unused), under mutex_.
  std::vector<std::optional<EngineMetricsSnapshot>> remote_metrics_;
  std::vector<std::vector<int64_t>> remote_expert_counts_;
  ExpertCounts expert_counts_;
  // Other ranks.
  std::unordered_map<RequestId, Hosted> hosted_;  // by rank 0's id; engine thread only
  Outbox outputs_;
  // A hosted request finished since the last report (under mutex_), and when that was sent
  // (engine thread only).
  bool report_due_ = true;
  std::chrono::steady_clock::time_point last_report_{};
};

}  // namespace peerserve
