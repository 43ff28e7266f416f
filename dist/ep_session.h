// Expert parallelism for the commands that run the model (generate, score, serve):
//
//   mpirun -np N peerserve generate --ep N --model DIR ...
//
// One EpSession per process. It starts MPI (when --ep > 1), checks that the job has
// exactly --ep processes, gives this rank its share of the routed experts to load
// (contiguous: experts [r E/N, (r+1) E/N) of every MoE layer), installs the
// expert-parallel backend into the loaded model, and keeps the ranks in lock-step: before
// each forward every rank says how many rows it brings (dist::StepCoordinator); whenever
// anyone has work, everyone steps, the idle ranks with zero rows.
//
// Without --ep (or --ep 1) and outside mpirun the session is inert: single process,
// every call a no-op. Started by mpirun with more than one process but --ep 1 is an error
// (each process would otherwise run the whole job on its own).
//
// Online EPLB (--eplb-interval N): every rank counts the (token, expert) pairs its steps
// route; every N agreed steps the ranks sum the counts, compute DeepSeek's EPLB placement
// with --eplb-redundant-experts copies of the hottest experts, read the experts they newly
// hold and swap in a new expert-parallel backend, between two steps (requests in flight
// continue; outputs do not change, see tests/dist/expert_rebalance_test.cc).
//
// Attention, dense MLPs and shared experts are replicated; while every rank brings at most
// --ep-split-rows rows to a step, their products run split over the ranks (tensor
// parallel, dist/tensor_parallel_backend.h), so that a lone request's rank does not stream
// those weights alone.
//
// Errors after MPI started: an error every rank meets in the same way (a bad option) is
// printed by rank 0 and every rank exits 1; an error of one rank (a lost peer, a load
// failure) is printed by that rank, naming it, and ends the whole job (MPI_Abort).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "dist/step_coordinator.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"

namespace peerserve {

// The expert-parallel options of a command (apps/ep_options.h adds them as flags).
struct EpCli {
  int ep = 1;
  std::string dispatch_dtype = "int8";
  int peer_timeout_ms = 60000;
  // How long a rank waits for the others to finish loading (the model at start-up, the
  // experts it newly holds at a rebalance): reading weights takes longer than an exchange,
  // and unevenly, so a rank still reading is not taken for lost after peer_timeout_ms.
  int load_timeout_ms = 1800000;
  int64_t eplb_interval = 0;  // steps between expert rebalances; 0 = never
  int eplb_redundant_experts = 0;
  // Split the attention projections, dense MLPs and shared experts over the ranks when no
  // rank brings more rows to a step than this (dist/tensor_parallel_backend.h); 0 = never.
  int split_rows = 16;
  // How the ranks reach each other's exchange buffers (dist::MpiWindows): auto | network.
  std::string windows = "auto";
};

class EpSession {
 public:
  static Result<std::unique_ptr<EpSession>> start(const EpCli& cli);
  // Prints why start() failed (once per job: on rank 0 of an mpirun job) and returns 1.
  static int report_start_error(const Status& status);
  ~EpSession();
  EpSession(const EpSession&) = delete;
  EpSession& operator=(const EpSession&) = delete;

  bool distributed() const;
  int rank() const;
  int size() const;
  // Rank 0 (or the single process): the one that prints and writes outputs.
  bool leader() const { return rank() == 0; }

  // Plans this rank's share of the experts of the model in `model_dir` and leaves the
  // routed experts out of the model's own load (the session reads them). InvalidArgument
  // naming --ep when it does not divide the routed experts.
  // Collective (under --ep-load-timeout-ms): a rank that fails (its own copy of the
  // checkpoint unreadable) prints its error, and every rank returns an error.
  Status plan_experts(const std::string& model_dir, ModelOptions* options);
  // Replaces the loaded model's expert backend by the expert-parallel one; `max_rows` is
  // the most rows one forward of this rank can bring (sizes the exchange buffers).
  // Collective.
  Status install(DeepseekModel& model, int64_t max_rows);

  // The lock-step agreement; see dist/step_coordinator.h. Inert session: {step = rows > 0}.
  // `mail` reaches every rank (see StepCoordinator); an inert session returns it as its own.
  Result<dist::StepAgreement> agree(int64_t rows, bool stop = false,
                                    std::span<const std::byte> mail = {}, uint64_t proposal = 0);
  // agree(), then the expert rebalance when this step is due for one (--eplb-interval);
  // between steps, on the thread that drives the model.
  Result<dist::StepAgreement> agree_and_rebalance(DeepseekModel& model, int64_t rows,
                                                  bool stop = false,
                                                  std::span<const std::byte> mail = {},
                                                  uint64_t proposal = 0);
  // This rank's (token, expert) selections per [layer * experts + expert] since start (its own
  // tokens; rebalances do not reset it); empty in an inert session. Thread-safe.
  std::vector<int64_t> expert_load_totals() const;
  // Collective, between steps: an expert rebalance now, from the loads counted so far, with
  // --eplb-redundant-experts copies (what --eplb-interval does every N steps).
  Status rebalance_experts(DeepseekModel& model);
  // Leader: runs one forward in lock-step (agree, then forward).
  Status forward(DeepseekModel& model, std::span<const SequenceChunk> chunks, LatentKvCache& cache,
                 ForwardState& state, ForwardOutput* out);
  // Leader, when done: tells the followers to stop. Followers: steps with zero rows until
  // the leader stops, each a forward of the model with no chunks, or `empty_step` (what the
  // leader's steps run, with no rows: a speculative executor's also runs the MTP layer).
  // Both are no-ops in an inert session.
  Status finish();
  Status follow(DeepseekModel& model, LatentKvCache& cache);
  Status follow(DeepseekModel& model, const std::function<Status()>& empty_step);

  // Reports `status` and returns the exit code: in a distributed session an error that
  // only this rank met aborts the job (never returns), `everywhere` errors exit 1 on all.
  int fail(const Status& status, bool everywhere = false);

  struct Impl;

 private:
  Status plan_experts_here(const std::string& model_dir, ModelOptions* options);

  explicit EpSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
