#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <span>
#include <string>

#include "base/splitmix64.h"

namespace peerserve {

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options,
                                               std::unique_ptr<Executor> executor,
                                               const Tokenizer* tokenizer) {
  if (executor == nullptr) return invalid_argument("engine: no executor");
  if (options.max_n < 1) {
    return invalid_argument("engine: max_n = " + std::to_string(options.max_n) + ", expected >= 1");
  }
  if (executor->kv_block_tokens() != 0 &&
      executor->kv_block_tokens() != options.scheduler.block_pool.block_size) {
    return invalid_argument("engine: the scheduler's block size (" +
                            std::to_string(options.scheduler.block_pool.block_size) +
                            " tokens) differs from the executor's KV cache (" +
                            std::to_string(executor->kv_block_tokens()) + " tokens per block)");
  }
  SchedulerOptions scheduler_options = options.scheduler;
  if (scheduler_options.max_prompt_logprobs_tokens == 0 && options.vocab_size > 0) {
    // A prompt owing logprobs asks for a logits row (fp32, the vocabulary wide) per token of
    // a step: at most 256 MiB of them (DeepSeek-V3's 129,280 tokens: 519 rows), at least 16.
    constexpr int64_t kPromptLogitsBytes = int64_t{256} << 20;
    scheduler_options.max_prompt_logprobs_tokens = static_cast<int32_t>(
        std::clamp<int64_t>(kPromptLogitsBytes / (int64_t{options.vocab_size} * 4), 16, 1 << 30));
  }
  if (options.kv_pool) {
    if (!scheduler_options.block_pool.enable_prefix_caching) {
      return invalid_argument("a KV caching pool needs prefix caching (it is off)");
    }
    if (scheduler_options.prefix_root == kRootBlockHash) {
      return invalid_argument(
          "a KV caching pool needs hash chains rooted in the KV namespace "
          "(scheduler.prefix_root), not the engine-private root");
    }
    if (executor->kv_block_bytes() == 0) {
      return invalid_argument("a KV caching pool needs an executor that exports KV blocks");
    }
    scheduler_options.record_published_blocks = true;
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::create(scheduler_options));
  return std::unique_ptr<Engine>(
      new Engine(options, std::move(scheduler), std::move(executor), tokenizer));
}

Engine::Engine(const EngineOptions& options, std::unique_ptr<Scheduler> scheduler,
               std::unique_ptr<Executor> executor, const Tokenizer* tokenizer)
    : options_(options),
      scheduler_(std::move(scheduler)),
      executor_(std::move(executor)),
      tokenizer_(tokenizer) {
  spec_decode_active_ = options.scheduler.num_speculative_tokens > 0;
  seed_state_ = options.seed != 0 ? options.seed
                                  : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                        std::random_device{}();
  if (options.kv_pool) {
    connector_ = std::make_unique<KvPoolConnector>(options.kv_pool, executor_->kv_block_bytes(),
                                                   options.kv_pool_options, [this] {
                                                     {
                                                       std::lock_guard<std::mutex> lock(mutex_);
                                                       loads_ready_ = true;
                                                     }
                                                     wake_.notify_one();
                                                   });
    metrics_.update([](EngineMetricsSnapshot& m) { m.kv_pool_enabled = true; });
  }
  metrics_.update([&](EngineMetricsSnapshot& m) {
    m.spec_decode_num_speculative_tokens = options.scheduler.num_speculative_tokens;
    m.spec_decode_active = spec_decode_active_;
  });
  publish_scheduler_stats();
}

Engine::~Engine() {
  stop();
  connector_.reset();  // its worker calls back into this engine: gone before the rest
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_.load() || stopping_) return;
  running_.store(true);
  thread_ = std::thread([this] { run_loop(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  running_.store(false);
}

double Engine::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t Engine::default_max_tokens(int64_t num_prompt_tokens) const {
  return max_tokens_limit(options_.scheduler, num_prompt_tokens);
}

EngineMetricsSnapshot Engine::metrics() const {
  EngineMetricsSnapshot m = metrics_.snapshot();
  // The pool's figures as of now: pushes and writes finish after the step that made them.
  if (connector_) m.kv_pool = connector_->counters();
  return m;
}

Status Engine::validate(EngineRequest& request) const {
  GenerationParams& params = request.params;
  PS_RETURN_IF_ERROR(params.sampling.validate());
  if (params.n < 1 || params.n > options_.max_n) {
    return invalid_argument("n = " + std::to_string(params.n) + ", expected 1.." +
                            std::to_string(options_.max_n));
  }
  if (params.n > options_.scheduler.max_waiting_seqs) {  // a 429 would be retried in vain
    return invalid_argument("n = " + std::to_string(params.n) + ", more than the " +
                            std::to_string(options_.scheduler.max_waiting_seqs) +
                            " sequences the waiting queue holds");
  }
  const int64_t num_prompt = static_cast<int64_t>(request.prompt_tokens.size());
  if (num_prompt == 0) return invalid_argument("the prompt is empty, expected >= 1 token");
  if (options_.vocab_size > 0) {
    for (TokenId t : request.prompt_tokens) {
      if (t < 0 || t >= options_.vocab_size) {
        return invalid_argument("prompt token id " + std::to_string(t) +
                                " is outside the vocabulary [0, " +
                                std::to_string(options_.vocab_size) + ")");
      }
    }
  }
  if (request.kv_push && !connector_) {
    return invalid_argument("a KV push needs an engine with a KV caching pool (--kv-pool)");
  }
  if (params.prompt_logprobs && (*params.prompt_logprobs < 0 || *params.prompt_logprobs > 20)) {
    return invalid_argument("prompt_logprobs = " + std::to_string(*params.prompt_logprobs) +
                            ", expected 0..20");
  }
  // Token ids the request names besides its prompt.
  const auto check_ids = [&](const char* what, auto&& ids) -> Status {
    for (const TokenId t : ids) {
      if (t < 0 || (options_.vocab_size > 0 && t >= options_.vocab_size)) {
        return invalid_argument(std::string(what) + ": token id " + std::to_string(t) +
                                " is outside the vocabulary [0, " +
                                std::to_string(options_.vocab_size) + ")");
      }
    }
    return ok_status();
  };
  // Named by the request field, which the server reports as the error's param.
  PS_RETURN_IF_ERROR(check_ids("stop_token_ids", params.stop_token_ids));
  // A plain copy of the keys: clang 14 cannot use libstdc++ 12's views (the sanitizer build).
  std::vector<TokenId> biased;
  biased.reserve(params.sampling.logit_bias.size());
  for (const auto& entry : params.sampling.logit_bias) biased.push_back(entry.first);
  PS_RETURN_IF_ERROR(check_ids("logit_bias", biased));
  PS_RETURN_IF_ERROR(check_ids("forced", params.sampling.forced_tokens));
  PS_RETURN_IF_ERROR(check_ids("allowed_token_ids", params.sampling.allowed_token_ids));
  for (const std::vector<TokenId>& word : params.sampling.bad_words_ids) {
    PS_RETURN_IF_ERROR(check_ids("bad_words", word));
  }
  for (const std::string& s : params.stop_strings) {
    if (s.empty()) return invalid_argument("stop strings must not be empty");
  }
  if (!params.stop_strings.empty() && tokenizer_ == nullptr) {
    return invalid_argument("stop strings need a tokenizer, and this model has none");
  }
  if (!params.max_tokens) {
    // Default: up to the context (or KV cache) limit, or the request's default within it;
    // at least 1 so that a prompt that fills the context gets the "too long" error below.
    int64_t limit = default_max_tokens(num_prompt);
    if (params.default_max_tokens) limit = std::min<int64_t>(limit, *params.default_max_tokens);
    params.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(limit, 1, INT32_MAX));
  }
  if (params.sampling.min_tokens > *params.max_tokens) {
    return invalid_argument("min_tokens = " + std::to_string(params.sampling.min_tokens) +
                            " is larger than max_tokens = " + std::to_string(*params.max_tokens));
  }
  return check_sequence_fits(options_.scheduler, num_prompt, *params.max_tokens);
}

Result<RequestId> Engine::submit(EngineRequest request, OutputSink sink) {
  PS_RETURN_IF_ERROR(validate(request));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!running_.load() || stopping_) return unavailable("the engine is not running");
  if (lockstep_lost_.load()) return unavailable(lockstep_error_.message());
  const int64_t queued = inbox_sequences_ + admitting_sequences_ + waiting_sequences_.load();
  if (queued + request.params.n > options_.scheduler.max_waiting_seqs) {
    return resource_exhausted(
        "the waiting queue is full (" + std::to_string(queued) + " sequences waiting, limit " +
        std::to_string(options_.scheduler.max_waiting_seqs) + "); retry later");
  }
  const RequestId id = next_request_id_++;
  inbox_sequences_ += request.params.n;
  inbox_.push_back(Pending{id, std::move(request), std::move(sink), now()});
  wake_.notify_one();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_inbox_.push_back(id);
  }
  wake_.notify_one();
}

void Engine::run_loop() {
  while (true) {
    std::vector<Pending> arrivals;
    std::vector<RequestId> aborts;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto ready = [&] {
        return stopping_ || !inbox_.empty() || !abort_inbox_.empty() || loads_ready_ ||
               (scheduler_->has_work() && !waiting_for_loads_);
      };
      if (options_.lockstep && !lockstep_lost_) {
        wake_.wait_for(lock, options_.lockstep_idle_poll, ready);  // idle ranks still agree
      } else {
        wake_.wait(lock, ready);
      }
      if (stopping_) break;
      arrivals.swap(inbox_);
      aborts.swap(abort_inbox_);
      admitting_sequences_ = inbox_sequences_;
      inbox_sequences_ = 0;
      loads_ready_ = false;
    }
    for (Pending& p : arrivals) admit(std::move(p));
    // The arrivals count as waiting from here on, not as nothing until the step after them
    // ends: submits during that step took the queue for empty and the scheduler refused the
    // surplus after they were accepted (a 200 and an error event instead of a 429).
    publish_waiting_sequences();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      admitting_sequences_ = 0;
    }
    for (RequestId id : aborts) abort_now(id, FinishReason::kAbort, ok_status());
    if (connector_) finish_loads();
    waiting_for_loads_ = false;  // something changed: plan again
    if (options_.lockstep && !lockstep_lost_) {
      lockstep_step();
    } else if (scheduler_->has_work()) {
      StepPlan plan = scheduler_->schedule();
      if (plan.empty() && (!loading_.empty() || !orphaned_reservations_.empty())) {
        // Loads in flight hold blocks (a direct hand-off reserves its blocks for the whole
        // remote prefill) and nothing else fits meanwhile: wait for a load to end.
        waiting_for_loads_ = true;
      } else {
        step(std::move(plan));
      }
    }
    publish_scheduler_stats();
  }
  // Shutdown: everything still queued or running ends with kAbort.
  std::vector<Pending> leftovers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    leftovers.swap(inbox_);
    inbox_sequences_ = 0;
  }
  for (Pending& p : leftovers) admit(std::move(p));
  std::vector<RequestId> ids;
  for (const auto& [id, request] : live_) ids.push_back(id);
  for (const auto& [id, request] : loading_) ids.push_back(id);
  for (RequestId id : ids) abort_now(id, FinishReason::kAbort, ok_status());
  publish_scheduler_stats();
}

void Engine::admit(Pending pending) {
  // Prompt logprobs need the whole prompt computed here: KV from the pool or a prefill
  // instance would go unused.
  if (connector_ && !pending.request.params.prompt_logprobs) {
    // Full prompt blocks past the local prefix cache may be in the pool: look them up first
    // (the last prompt token is always computed, as in the scheduler's own lookup).
    const std::vector<TokenId>& prompt = pending.request.prompt_tokens;
    const int32_t bs = options_.scheduler.block_pool.block_size;
    std::vector<BlockHash> chain;
    extend_block_hash_chain(
        prompt, bs, salted_root_hash(options_.scheduler.prefix_root, pending.request.cache_salt),
        &chain, scheduler_->block_hash_lookahead());
    chain.resize(std::min(chain.size(), (prompt.size() - 1) / static_cast<size_t>(bs)));
    const int64_t local = scheduler_->cached_prefix_blocks(chain);
    if (local < static_cast<int64_t>(chain.size())) {
      const RequestId id = pending.id;
      std::vector<BlockHash> missing(chain.begin() + local, chain.end());
      const size_t full = missing.size();
      // The partial block after the full ones comes along when one sequence will use it.
      const bool want_tail =
          (prompt.size() - 1) % static_cast<size_t>(bs) != 0 && pending.request.params.n == 1;
      Loading loading{std::move(pending), std::move(chain), local, {}, {}};
      std::vector<std::span<std::byte>> destinations;
      std::span<std::byte> tail_destination;
      if (options_.kv_pool_options.handoff) {
        // Direct: the blocks are reserved now and written in place by the connector (pool
        // hits) or the hand-off receiver (a prefill instance's push); no staging copy.
        loading.reservation = scheduler_->reserve_blocks(
            std::span<const BlockHash>(loading.chain).first(static_cast<size_t>(local)),
            static_cast<int64_t>(full) + (want_tail ? 1 : 0));
        if (want_tail && loading.reservation.fresh.size() == full + 1) {
          loading.tail_block = loading.reservation.fresh.back();
          loading.reservation.fresh.pop_back();
          tail_destination = executor_->kv_block_memory(*loading.tail_block);
        }
        for (BlockId block : loading.reservation.fresh) {
          destinations.push_back(executor_->kv_block_memory(block));
        }
        missing.resize(destinations.size());
        if (missing.empty()) {  // no free block to receive into: compute it here
          release_reserved_tail(loading);
          admit_now(std::move(loading.pending));
          return;
        }
      }
      connector_->start_load(id, std::move(missing), loading.pending.request.prompt_tokens, local,
                             std::move(destinations), tail_destination,
                             loading.pending.request.prefill_hint,
                             loading.pending.request.cache_salt);
      loading_.emplace(id, std::move(loading));
      return;
    }
  }
  admit_now(std::move(pending));
}

void Engine::finish_loads() {
  for (KvPoolConnector::Loaded& loaded : connector_->take_loaded()) {
    if (auto orphan = orphaned_reservations_.find(loaded.request);
        orphan != orphaned_reservations_.end()) {
      // Aborted while loading: nobody writes its blocks (its tail block among them) any
      // more; free them.
      (void)scheduler_->commit_reservation(orphan->second, {}, 0);
      orphaned_reservations_.erase(orphan);
      continue;
    }
    auto it = loading_.find(loaded.request);
    if (it == loading_.end()) continue;  // aborted while loading
    Loading loading = std::move(it->second);
    loading_.erase(it);
    int64_t adopted = 0;
    if (!loading.reservation.fresh.empty()) {
      std::span<const BlockHash> chain(loading.chain);
      const auto num_full = static_cast<int64_t>(loading.reservation.fresh.size());
      adopted =
          scheduler_->commit_reservation(loading.reservation,
                                         chain.subspan(static_cast<size_t>(loading.local_blocks),
                                                       loading.reservation.fresh.size()),
                                         loaded.landed);
      // The pushed partial block is the sequence's, if everything before it arrived too.
      if (loading.tail_block && loaded.tail_landed && adopted == num_full) {
        loading.pending.prefilled_tail = loading.tail_block;
        loading.tail_block.reset();
      }
      release_reserved_tail(loading);
    } else if (!loaded.blocks.empty()) {
      std::span<const BlockHash> chain(loading.chain);
      adopted = scheduler_->adopt_blocks(
          chain.first(static_cast<size_t>(loading.local_blocks)),
          chain.subspan(static_cast<size_t>(loading.local_blocks), loaded.blocks.size()),
          [&](size_t i, BlockId block) {
            return executor_->write_kv_block(block, loaded.blocks[i]).ok();
          });
    }
    const int64_t hit_tokens = adopted * options_.scheduler.block_pool.block_size;
    metrics_.update([&](EngineMetricsSnapshot& m) {
      m.kv_pool_hit_tokens += hit_tokens;
      m.kv_pool_load_latency.observe(loaded.seconds);
    });
    admit_now(std::move(loading.pending));
  }
}

void Engine::release_reserved_tail(Loading& loading) {
  if (!loading.tail_block) return;
  (void)scheduler_->commit_reservation({{}, {*loading.tail_block}}, {}, 0);
  loading.tail_block.reset();
}

void Engine::store_published_blocks() {
  std::vector<Scheduler::PublishedBlock> published = scheduler_->take_published_blocks();
  std::vector<BlockHash> hashes;
  std::vector<std::vector<std::byte>> blocks;
  for (const Scheduler::PublishedBlock& p : published) {
    if (!p.prompt && !options_.kv_pool_store_decode_blocks) continue;
    std::vector<std::byte> bytes(connector_->block_bytes());
    if (!executor_->read_kv_block(p.block, bytes).ok()) continue;
    hashes.push_back(p.hash);
    blocks.push_back(std::move(bytes));
  }
  connector_->store(std::move(hashes), std::move(blocks));
}

void Engine::push_computed_prompts(const StepPlan& plan) {
  const int32_t bs = options_.scheduler.block_pool.block_size;
  for (const ScheduledChunk& chunk : plan.chunks) {
    auto owner = owner_of_seq_.find(chunk.seq_id);
    if (owner == owner_of_seq_.end() || owner->second.second != 0) continue;
    LiveRequest& request = live_.at(owner->second.first);
    if (!request.request.kv_push || request.kv_pushed) continue;
    const std::vector<TokenId>& prompt = request.request.prompt_tokens;
    const int64_t known = chunk.start_pos + static_cast<int64_t>(chunk.tokens.size()) -
                          static_cast<int64_t>(chunk.drafts.size());
    if (known < static_cast<int64_t>(prompt.size())) continue;  // prompt not done yet
    request.kv_pushed = true;
    // The blocks the decode instance reuses: full ones before the last prompt token.
    std::vector<BlockHash> chain;
    extend_block_hash_chain(
        prompt, bs, salted_root_hash(options_.scheduler.prefix_root, request.request.cache_salt),
        &chain, scheduler_->block_hash_lookahead());
    const size_t end = std::min(
        {chain.size(), (prompt.size() - 1) / static_cast<size_t>(bs), chunk.block_table.size()});
    const KvPushTarget& target = *request.request.kv_push;
    std::vector<BlockHash> hashes;
    std::vector<std::vector<std::byte>> blocks;
    bool complete = true;
    for (size_t i = static_cast<size_t>(target.first_block); i < end; ++i) {
      std::vector<std::byte> bytes(connector_->block_bytes());
      if (!executor_->read_kv_block(chunk.block_table[i], bytes).ok()) {
        complete = false;
        break;
      }
      hashes.push_back(chain[i]);
      blocks.push_back(std::move(bytes));
    }
    // The partial block holding the prompt's last full-block remainder.
    const size_t tail = (prompt.size() - 1) / static_cast<size_t>(bs);
    if (target.tail && complete && (prompt.size() - 1) % static_cast<size_t>(bs) != 0 &&
        tail < chunk.block_table.size()) {
      std::vector<std::byte> bytes(connector_->block_bytes());
      if (executor_->read_kv_block(chunk.block_table[tail], bytes).ok()) {
        hashes.push_back(kPrefilledTailHash);
        blocks.push_back(std::move(bytes));
      }
    }
    if (!hashes.empty()) connector_->push(target, std::move(hashes), std::move(blocks));
  }
}

void Engine::admit_now(Pending pending) {
  LiveRequest live;
  live.id = pending.id;
  live.request = std::move(pending.request);
  live.sink = std::move(pending.sink);
  live.arrival_time = pending.arrival_time;
  live.usage.prompt_tokens = static_cast<int64_t>(live.request.prompt_tokens.size());
  const GenerationParams& params = live.request.params;
  const uint64_t base_seed =
      params.sampling.seed ? *params.sampling.seed : splitmix64_next(seed_state_);

  Status status;
  const SequenceId first_seq_id = next_seq_id_;
  for (int32_t i = 0; i < params.n; ++i) {
    SequenceSpec spec;
    spec.id = next_seq_id_++;
    spec.prompt_tokens = live.request.prompt_tokens;
    spec.max_tokens = *params.max_tokens;
    spec.sampling = params.sampling;
    spec.seed = base_seed + static_cast<uint64_t>(i);
    spec.stop_token_ids = params.stop_token_ids;
    spec.cache_salt = live.request.cache_salt;
    if (i > 0) spec.prompt_from = first_seq_id;  // shares choice 0's computed prompt blocks
    if (i == 0 && params.prompt_logprobs) spec.prompt_logprobs = *params.prompt_logprobs;
    if (!params.ignore_eos) spec.eos_token_ids = options_.eos_token_ids;
    if (i == 0 && pending.prefilled_tail) {
      spec.prefilled_tail_block = pending.prefilled_tail;
      spec.prefilled_tail_tokens =
          static_cast<int32_t>((spec.prompt_tokens.size() - 1) %
                               static_cast<size_t>(options_.scheduler.block_pool.block_size));
      pending.prefilled_tail.reset();  // the scheduler owns it now, whatever add() says
    }
    if (spec.sampling.min_tokens > 0) {
      // Until min_tokens are out, the tokens that would end the choice cannot be drawn; EOS
      // neither, even under ignore_eos (vLLM's min_tokens processor blocks it always).
      spec.sampling.suppressed_until_min_tokens = spec.stop_token_ids;
      spec.sampling.suppressed_until_min_tokens.insert(
          spec.sampling.suppressed_until_min_tokens.end(), options_.eos_token_ids.begin(),
          options_.eos_token_ids.end());
    }
    status = scheduler_->add(spec);
    if (!status.ok()) break;
    Choice choice;
    choice.seq_id = spec.id;
    if (tokenizer_ != nullptr) {
      choice.detokenizer.emplace(*tokenizer_,
                                 DecodeOptions{.skip_special_tokens = params.skip_special_tokens});
    }
    choice.stop_matcher = StopStringMatcher(params.stop_strings, params.include_stop_str_in_output);
    owner_of_seq_[spec.id] = {live.id, i};
    live.choices.push_back(std::move(choice));
    ++live.num_unfinished;
  }
  const RequestId id = live.id;
  live_.emplace(id, std::move(live));
  if (!status.ok()) abort_now(id, FinishReason::kError, status);
}

void Engine::lockstep_step() {
  StepPlan plan;
  if (scheduler_->has_work()) plan = scheduler_->schedule();
  Result<bool> go = options_.lockstep(plan.num_batched_tokens);
  if (!go.ok()) {
    if (!plan.empty()) scheduler_->abandon(plan);
    lose_group(go.status());
    return;
  }
  if (*go) {
    step(std::move(plan));  // possibly empty: this rank lends its experts
  } else if (!plan.empty()) {
    scheduler_->abandon(plan);  // not stepping now: the plan is made again next time
  }
}

void Engine::lose_group(const Status& why) {
  // Nothing can run any more: every live request ends with the error, new ones are refused.
  // Unavailable whatever the cause (a failed swap's InvalidArgument would read as the
  // client's fault: 400 on this rank's requests, 503 on the others').
  const Status error = unavailable("expert-parallel group lost: " + why.message());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lockstep_error_ = error;
  }
  lockstep_lost_ = true;
  std::vector<RequestId> ids;
  for (const auto& [id, request] : live_) ids.push_back(id);
  for (const auto& [id, request] : loading_) ids.push_back(id);  // still fetching KV
  for (RequestId id : ids) abort_now(id, FinishReason::kError, error);
}

void Engine::step(StepPlan plan) {
  // Without lock-step the scheduler always plans something when it has work (every queued
  // sequence fits an empty pool, and blocks held by loads in flight are waited for in
  // run_loop), so an empty plan here is a bug, not a state to wait in.
  PS_CHECK(!plan.empty() || options_.lockstep) << "scheduler has work but planned an empty step";
  const double start = now();
  for (const ScheduledChunk& chunk : plan.chunks) {
    auto owner = owner_of_seq_.find(chunk.seq_id);
    if (owner == owner_of_seq_.end()) continue;
    LiveRequest& request = live_.at(owner->second.first);
    if (!request.first_scheduled_time) request.first_scheduled_time = start;
  }
  publish_waiting_sequences();  // what the plan took out of the queue is free again
  Result<StepResult> result = executor_->execute(plan);
  if (!result.ok()) {
    scheduler_->abandon(plan);
    fail_plan(plan, result.status());
    // Under lock-step a step that failed on this rank left the group's exchanges uneven
    // (the others waited out their timeout, or this rank stopped before its dispatch), so
    // the ranks' step counters no longer agree: the group cannot go on.
    if (options_.lockstep) {
      lose_group(result.status());
      if (options_.lockstep_broken) options_.lockstep_broken(result.status());
    }
    return;
  }
  if (plan.empty()) return;  // a lock-step dummy step
  std::vector<SequenceUpdate> updates = scheduler_->update(plan, *result);
  if (connector_) {
    // Before the next step can reuse the blocks; the push first (a decode instance waits).
    push_computed_prompts(plan);
    store_published_blocks();
  }
  const double end = now();
  metrics_.update([&](EngineMetricsSnapshot& m) {
    ++m.steps_total;
    m.batched_tokens_total += plan.num_batched_tokens;
  });
  note_speculation_change();
  std::unordered_map<RequestId, RequestOutput> outputs;
  for (const SequenceUpdate& update : updates) apply_update(update, end, &outputs);
  deliver(&outputs, end);
}

void Engine::note_speculation_change() {
  if (!spec_decode_active_ || scheduler_->speculation_enabled()) return;
  spec_decode_active_ = false;
  metrics_.update([](EngineMetricsSnapshot& m) { m.spec_decode_active = false; });
  const int64_t verified = scheduler_->drafts_verified();
  const int64_t accepted = scheduler_->drafts_accepted();
  std::fprintf(stderr,
               "speculative decoding: %lld of %lld drafts accepted (%.0f%%), below the %.0f%% it "
               "needs to pay here; turned off\n",
               static_cast<long long>(accepted), static_cast<long long>(verified),
               verified > 0 ? 100.0 * static_cast<double>(accepted) / verified : 0.0,
               100.0 * options_.scheduler.speculative_min_acceptance);
}

void Engine::fail_plan(const StepPlan& plan, const Status& error) {
  std::vector<RequestId> failed;
  for (const ScheduledChunk& chunk : plan.chunks) {
    auto owner = owner_of_seq_.find(chunk.seq_id);
    if (owner != owner_of_seq_.end()) failed.push_back(owner->second.first);
  }
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  for (RequestId id : failed) abort_now(id, FinishReason::kError, error);
}

void Engine::apply_update(const SequenceUpdate& update, double now,
                          std::unordered_map<RequestId, RequestOutput>* outputs) {
  auto owner = owner_of_seq_.find(update.seq_id);
  if (owner == owner_of_seq_.end()) return;
  const auto [request_id, choice_index] = owner->second;
  const int32_t index = choice_index;  // a lambda below captures it (not a structured binding)
  LiveRequest& request = live_.at(request_id);
  Choice& choice = request.choices[index];
  if (choice.finished) return;
  RequestOutput& out = (*outputs)[request_id];
  out.request_id = request_id;
  auto it = std::find_if(out.choices.begin(), out.choices.end(),
                         [&](const ChoiceDelta& d) { return d.index == index; });
  if (it == out.choices.end()) {
    ChoiceDelta fresh;
    fresh.index = index;
    out.choices.push_back(std::move(fresh));
    it = out.choices.end() - 1;
  }
  ChoiceDelta& delta = *it;
  if (!update.prompt_logprobs.empty()) out.prompt_logprobs = update.prompt_logprobs;

  if (update.num_drafts > 0) {
    metrics_.update([&](EngineMetricsSnapshot& m) {
      ++m.spec_decode_num_drafts;
      m.spec_decode_num_draft_tokens += update.num_drafts;
      m.spec_decode_num_accepted_tokens += update.num_accepted_drafts;
      for (int32_t k = 0; k < update.num_accepted_drafts &&
                          k < static_cast<int32_t>(m.spec_decode_accepted_per_position.size());
           ++k) {
        ++m.spec_decode_accepted_per_position[static_cast<size_t>(k)];
      }
      m.spec_decode_acceptance_length.observe(1.0 + update.num_accepted_drafts);
    });
  }
  for (const SampledToken& sampled : update.tokens) {
    const TokenId token = sampled.token;
    delta.token_ids.push_back(token);
    if (request.request.params.sampling.want_logprobs) delta.logprobs.push_back(sampled);
    ++choice.num_generated;
    ++request.usage.completion_tokens;
    if (index == 0) request.usage.cached_prompt_tokens = update.num_cached_prompt_tokens;
    const bool first_of_request = !request.first_token_time;
    if (first_of_request) request.first_token_time = now;
    // One inter-token latency per step that brought tokens, as vLLM counts it: the tokens
    // after the first of an update (accepted drafts) arrived with it, not 0 s later.
    const bool first_of_update = &sampled == &update.tokens.front();
    const double itl =
        choice.num_generated > 1 && first_of_update ? now - choice.last_token_time : -1.0;
    choice.last_token_time = now;
    metrics_.update([&](EngineMetricsSnapshot& m) {
      ++m.generation_tokens_total;
      if (first_of_request) {
        m.time_to_first_token.observe(now - request.arrival_time);
        m.prompt_tokens_total += request.usage.prompt_tokens;
        if (request.first_scheduled_time) {
          m.queue_time.observe(*request.first_scheduled_time - request.arrival_time);
        }
      }
      if (itl >= 0) m.inter_token_latency.observe(itl);
    });
    // The token that ends the choice (EOS or a stop token id) is always the update's last;
    // its text is left out, as a stop string's is, unless include_stop_str_in_output (vLLM).
    const bool stop_token_text_dropped = update.stop_token && &sampled == &update.tokens.back() &&
                                         !request.request.params.include_stop_str_in_output;
    if (choice.detokenizer && !stop_token_text_dropped) {
      // Ids the tokenizer does not know (a model vocabulary larger than the tokenizer's)
      // contribute no text.
      Result<std::string> piece = choice.detokenizer->push(token);
      if (piece.ok() && choice.num_generated <= request.request.params.sampling.min_tokens) {
        // As in vLLM, a stop string cannot end in the first min_tokens tokens' text but
        // may start there.
        delta.text += choice.stop_matcher.push_context(*piece).text;
      } else if (piece.ok()) {
        StopStringMatcher::Step s = choice.stop_matcher.push(*piece);
        delta.text += s.text;
        if (s.matched) {
          // The tokens after this one (accepted drafts) are dropped with the sequence.
          delta.stop_string = s.matched;
          scheduler_->finish(update.seq_id, FinishReason::kStop);
          finish_choice(request, index, FinishReason::kStop, &delta, now);
          return;
        }
      }
    }
  }
  if (update.finish_reason) {
    // vLLM's stop_reason: the stop_token_ids entry that ended the choice; null for EOS.
    if (!update.stopped_on_eos) delta.stop_token = update.stop_token;
    finish_choice(request, index, *update.finish_reason, &delta, now);
  }
}

void Engine::finish_choice(LiveRequest& request, int32_t index, FinishReason reason,
                           ChoiceDelta* delta, double now) {
  Choice& choice = request.choices[index];
  if (choice.finished) return;
  choice.finished = true;
  --request.num_unfinished;
  owner_of_seq_.erase(choice.seq_id);
  delta->finish_reason = reason;
  if (choice.detokenizer && !delta->stop_string) {
    // Flush what was held back: an unfinished UTF-8 character, then a possible stop prefix.
    const std::string tail = choice.detokenizer->finish();
    StopStringMatcher::Step s = choice.num_generated <= request.request.params.sampling.min_tokens
                                    ? choice.stop_matcher.push_context(tail)
                                    : choice.stop_matcher.push(tail);
    delta->text += s.text;
    if (s.matched) {
      delta->stop_string = s.matched;
    } else {
      delta->text += choice.stop_matcher.flush();
    }
  }
  if (index == 0 && request.first_token_time && choice.num_generated > 1) {
    const double tpot = (now - *request.first_token_time) / (choice.num_generated - 1);
    metrics_.update([&](EngineMetricsSnapshot& m) { m.time_per_output_token.observe(tpot); });
  }
}

void Engine::deliver(std::unordered_map<RequestId, RequestOutput>* outputs, double now) {
  for (auto& [id, out] : *outputs) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    LiveRequest& request = it->second;
    out.usage = request.usage;
    out.finished = request.num_unfinished == 0;
    std::sort(out.choices.begin(), out.choices.end(),
              [](const ChoiceDelta& a, const ChoiceDelta& b) { return a.index < b.index; });
    if (out.finished) {
      const FinishReason reason = out.choices.empty() || !out.choices[0].finish_reason
                                      ? FinishReason::kStop
                                      : *out.choices[0].finish_reason;
      metrics_.update([&](EngineMetricsSnapshot& m) {
        m.e2e_request_latency.observe(now - request.arrival_time);
        ++m.requests_finished_total[static_cast<size_t>(reason)];
      });
      OutputSink sink = std::move(request.sink);
      live_.erase(it);
      if (sink) sink(std::move(out));
    } else if (request.sink) {
      request.sink(std::move(out));
    }
  }
  outputs->clear();
}

void Engine::abort_now(RequestId id, FinishReason reason, const Status& error) {
  if (auto loading = loading_.find(id); loading != loading_.end()) {
    // Still waiting for its pool lookup: nothing is in the scheduler yet. Reserved blocks
    // may still be written into; they are freed when the lookup comes back.
    Pending pending = std::move(loading->second.pending);
    if (connector_) connector_->cancel(id);  // a queued load gives its blocks back at once
    if (!loading->second.reservation.fresh.empty()) {
      Scheduler::Reservation& reserved = loading->second.reservation;
      if (loading->second.tail_block) reserved.fresh.push_back(*loading->second.tail_block);
      orphaned_reservations_.emplace(id, std::move(reserved));
    }
    loading_.erase(loading);
    RequestOutput out;
    out.request_id = id;
    for (int32_t i = 0; i < pending.request.params.n; ++i) {
      ChoiceDelta delta;
      delta.index = i;
      delta.finish_reason = reason;
      out.choices.push_back(std::move(delta));
    }
    out.error = error;
    out.usage.prompt_tokens = static_cast<int64_t>(pending.request.prompt_tokens.size());
    out.finished = true;
    metrics_.update([&](EngineMetricsSnapshot& m) {
      ++m.requests_finished_total[static_cast<size_t>(reason)];
    });
    if (pending.sink) pending.sink(std::move(out));
    return;
  }
  auto it = live_.find(id);
  if (it == live_.end()) return;
  LiveRequest& request = it->second;
  const double t = now();
  RequestOutput out;
  out.request_id = id;
  for (int32_t i = 0; i < static_cast<int32_t>(request.choices.size()); ++i) {
    Choice& choice = request.choices[i];
    if (choice.finished) continue;
    scheduler_->finish(choice.seq_id, reason);
    ChoiceDelta delta;
    delta.index = i;
    choice.finished = true;
    --request.num_unfinished;
    owner_of_seq_.erase(choice.seq_id);
    delta.finish_reason = reason;
    out.choices.push_back(std::move(delta));
  }
  out.error = error;
  out.usage = request.usage;
  out.finished = true;
  metrics_.update([&](EngineMetricsSnapshot& m) {
    m.e2e_request_latency.observe(t - request.arrival_time);
    ++m.requests_finished_total[static_cast<size_t>(reason)];
  });
  OutputSink sink = std::move(request.sink);
  live_.erase(it);
  if (sink) sink(std::move(out));
}

void Engine::publish_waiting_sequences() {
  int64_t loading_sequences = 0;  // waiting for their pool lookups: queued all the same
  for (const auto& [id, loading] : loading_) loading_sequences += loading.pending.request.params.n;
  waiting_sequences_.store(scheduler_->num_waiting() + loading_sequences);
}

void Engine::publish_scheduler_stats() {
  SchedulerStats stats = scheduler_->stats();
  publish_waiting_sequences();
  KvPoolCounters pool;
  if (connector_) pool = connector_->counters();
  metrics_.update([&](EngineMetricsSnapshot& m) {
    m.scheduler = stats;
    m.kv_pool = pool;
  });
}

}  // namespace peerserve
