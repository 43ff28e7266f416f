// Engine: the loop that keeps stepping. It owns the scheduler and the executor and runs them
// on its own thread:
//
//   drain new requests and aborts -> schedule() -> execute() -> update() -> outputs
//
// Outputs are turned into text on the engine thread (incremental detokenizer per choice),
// stop strings are matched there across token boundaries, and each request's sink is
// called with the deltas of that step. Sinks run on the engine thread and must not block
// (the HTTP front end posts them to its own event loop).
//
// Thread-safety: submit(), abort(), metrics() and stop() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "runtime/engine_client.h"
#include "runtime/engine_metrics.h"
#include "runtime/executor.h"
#include "runtime/kv_pool_connector.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/stop_string_matcher.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

struct EngineOptions {
  SchedulerOptions scheduler;
  // Each ends generation unless ignore_eos. Default: none.
  std::vector<TokenId> eos_token_ids;
  // Prompt token ids must be below this (the model's vocabulary); 0 = unchecked.
  int64_t vocab_size = 0;
  // Choices per request at most. Default 16.
  int32_t max_n = 16;
  // Base of the seeds given to requests that bring none; 0 = from std::random_device.
  uint64_t seed = 0;
  // Lock-step with other engines (expert parallelism: every rank steps whenever any rank
  // has work, so that every MoE exchange is joined by all). Called on the engine thread
  // before each step with the rows this engine plans (0 when idle; then at least every
  // lockstep_idle_poll); true means step now, with an empty plan if this engine has none;
  // false means not now (a planned step is given back to the scheduler).
  // An error (a lost peer) fails every live request; the engine then refuses new ones.
  // Default: none (step only when there is work).
  std::function<Result<bool>(int64_t rows)> lockstep;
  // Told when this engine gives the group up on its own (a step failed under lock-step,
  // leaving the ranks' exchanges uneven), so that whatever watches the group ends too.
  std::function<void(const Status& why)> lockstep_broken;
  std::chrono::milliseconds lockstep_idle_poll{2};
  // A shared caching pool for context caching (runtime/kv_pool_connector.h): prompts look
  // up their full blocks there after the local prefix cache, and new full prompt blocks are
  // stored there. Needs prefix caching, scheduler.prefix_root set to the KvNamespace's root
  // and an executor that exports KV blocks. Default: none.
  std::shared_ptr<KvBlockStore> kv_pool;
  KvPoolConnectorOptions kv_pool_options;
  // Also store blocks that hold generated tokens (paper 000 §4.4.2: off by default).
  bool kv_pool_store_decode_blocks = false;
};

class Engine final : public EngineClient {
 public:
  // Called on the engine thread with each output of a request, the last one with
  // finished = true. Must not block and must not call back into the engine's submit().
  using OutputSink = EngineClient::OutputSink;

  // `tokenizer` may be null: outputs then carry token ids only and stop strings are
  // rejected. It must outlive the engine.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options,
                                                std::unique_ptr<Executor> executor,
                                                const Tokenizer* tokenizer);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Unfinished requests get a last output with finish reason kAbort; then the thread ends.
  void stop();

  // Queues a request. Errors (nothing is queued): InvalidArgument (bad parameters, empty
  // prompt, token id outside the vocabulary), OutOfRange (longer than the context or the
  // KV cache), ResourceExhausted (waiting queue full), Unavailable (engine not running).
  Result<RequestId> submit(EngineRequest request, OutputSink sink) override;
  // Ends a request early (its sink gets a last kAbort output unless it already finished).
  // Unknown or finished ids are ignored.
  void abort(RequestId id) override;

  // max_tokens used when a request does not set one.
  int64_t default_max_tokens(int64_t num_prompt_tokens) const;
  // The checks submit() makes on a request (and the defaults it fills in: max_tokens),
  // without queueing it: a front end that hands requests to other ranks' engines (which run
  // with the same options) checks them here first, so errors are answered at once.
  Status validate(EngineRequest& request) const;
  const EngineOptions& options() const override { return options_; }
  int64_t waiting_capacity() const override { return options_.scheduler.max_waiting_seqs; }
  EngineMetricsSnapshot metrics() const override;
  bool running() const override { return running_.load(); }

 private:
  struct Choice {
    SequenceId seq_id = 0;
    bool finished = false;
    int64_t num_generated = 0;
    double last_token_time = 0;
    std::optional<IncrementalDetokenizer> detokenizer;
    StopStringMatcher stop_matcher;
  };
  struct LiveRequest {
    RequestId id = 0;
    EngineRequest request;
    OutputSink sink;
    double arrival_time = 0;
    std::optional<double> first_scheduled_time;
    std::optional<double> first_token_time;
    std::vector<Choice> choices;
    int32_t num_unfinished = 0;
    Usage usage;
    bool kv_pushed = false;  // request.kv_push done
  };
  struct Pending {
    RequestId id;
    EngineRequest request;
    OutputSink sink;
    double arrival_time;
    // A pushed partial prompt block for choice 0 (SequenceSpec::prefilled_tail_block).
    std::optional<BlockId> prefilled_tail = std::nullopt;
  };
  // A request waiting for its pool lookup before it is admitted.
  struct Loading {
    Pending pending;
    std::vector<BlockHash> chain;  // the prompt's full blocks that may be shared
    int64_t local_blocks = 0;      // of which cached locally when the lookup started
    // Direct loads: the blocks the missing ones are written into (chain[local_blocks...]),
    // and a block for the prompt's partial last block, if a prefill instance is to push it.
    Scheduler::Reservation reservation;
    std::optional<BlockId> tail_block;
  };

  Engine(const EngineOptions& options, std::unique_ptr<Scheduler> scheduler,
         std::unique_ptr<Executor> executor, const Tokenizer* tokenizer);

  void run_loop();
  void admit(Pending pending);
  // Adds a request to the scheduler (after its pool lookup, if any).
  void admit_now(Pending pending);
  // Admits the requests whose pool lookups finished, with the blocks that were found.
  void finish_loads();
  // Hands the blocks published by the last step to the pool.
  void store_published_blocks();
  // Frees loading.tail_block, if still held.
  void release_reserved_tail(Loading& loading);
  // Prefill role: pushes the KV of prompts the step completed to the decode instances that
  // asked for it (EngineRequest::kv_push).
  void push_computed_prompts(const StepPlan& plan);
  void step(StepPlan plan);
  // One iteration under EngineOptions::lockstep.
  void lockstep_step();
  // The expert-parallel group cannot step together any more (EngineOptions::lockstep).
  void lose_group(const Status& why);
  void fail_plan(const StepPlan& plan, const Status& error);
  void abort_now(RequestId id, FinishReason reason, const Status& error);
  // Applies one sequence update to its request's choice and delta.
  void apply_update(const SequenceUpdate& update, double now,
                    std::unordered_map<RequestId, RequestOutput>* outputs);
  void finish_choice(LiveRequest& request, int32_t index, FinishReason reason, ChoiceDelta* delta,
                     double now);
  void deliver(std::unordered_map<RequestId, RequestOutput>* outputs, double now);
  // waiting_sequences_ from the scheduler and the loads in flight (engine thread).
  void publish_waiting_sequences();
  void publish_scheduler_stats();
  // Says so (log, metrics) when the scheduler's guard turned speculative decoding off.
  void note_speculation_change();
  double now() const;

  EngineOptions options_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Executor> executor_;
  const Tokenizer* tokenizer_;
  EngineMetrics metrics_;

  // Owned by the engine thread.
  std::unordered_map<RequestId, LiveRequest> live_;
  std::unique_ptr<KvPoolConnector> connector_;
  std::unordered_map<RequestId, Loading> loading_;
  // Reservations of requests aborted while loading, freed when their loads come back.
  std::unordered_map<RequestId, Scheduler::Reservation> orphaned_reservations_;
  // The last plan was empty because loads in flight hold the blocks it needed: the loop
  // sleeps until a load ends (or anything else arrives) instead of planning again at once.
  // Engine thread only (also read by the wait predicate, which runs on it).
  bool waiting_for_loads_ = false;
  std::unordered_map<SequenceId, std::pair<RequestId, int32_t>> owner_of_seq_;
  SequenceId next_seq_id_ = 1;
  uint64_t seed_state_ = 0;
  bool spec_decode_active_ = false;  // until the scheduler's guard turns it off

  // Set by the engine thread when the lock-step group broke; read by submit().
  std::atomic<bool> lockstep_lost_{false};
  Status lockstep_error_;  // guarded by mutex_

  // Shared with submitting threads.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending> inbox_;
  std::vector<RequestId> abort_inbox_;
  bool loads_ready_ = false;  // the connector finished a lookup
  int64_t inbox_sequences_ = 0;
  int64_t admitting_sequences_ = 0;  // taken from the inbox, not yet counted as waiting
  bool stopping_ = false;
  RequestId next_request_id_ = 1;
  std::atomic<int64_t> waiting_sequences_{0};
  std::atomic<bool> running_{false};
  std::thread thread_;
};

}  // namespace peerserve
