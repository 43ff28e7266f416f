#include "runtime/scheduler.h"

#include <algorithm>
#include <string>

#include "kv/prefix_hash.h"

namespace peerserve {
namespace {

int64_t blocks_for(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

Status SchedulerOptions::validate() const {
  if (max_num_seqs < 1) {
    return invalid_argument("max_num_seqs = " + std::to_string(max_num_seqs) + ", expected >= 1");
  }
  if (max_num_batched_tokens < 1) {
    return invalid_argument("max_num_batched_tokens = " + std::to_string(max_num_batched_tokens) +
                            ", expected >= 1");
  }
  if (max_model_len < 2) {
    return invalid_argument("max_model_len = " + std::to_string(max_model_len) + ", expected >= 2");
  }
  if (max_prefill_chunk_tokens < 0) {
    return invalid_argument("max_prefill_chunk_tokens = " +
                            std::to_string(max_prefill_chunk_tokens) + ", expected >= 0");
  }
  if (max_prompt_logprobs_tokens < 0) {
    return invalid_argument("max_prompt_logprobs_tokens = " +
                            std::to_string(max_prompt_logprobs_tokens) + ", expected >= 0");
  }
  if (max_waiting_seqs < 1) {
    return invalid_argument("max_waiting_seqs = " + std::to_string(max_waiting_seqs) +
                            ", expected >= 1");
  }
  if (block_pool.num_blocks < 1) {
    return invalid_argument("KV cache: " + std::to_string(block_pool.num_blocks) +
                            " blocks, expected >= 1 (raise the KV cache memory)");
  }
  if (speculative_guard_drafts < 0 || !(speculative_min_acceptance >= 0.0)) {
    return invalid_argument("speculative guard: " + std::to_string(speculative_guard_drafts) +
                            " drafts, acceptance " + std::to_string(speculative_min_acceptance) +
                            "; expected >= 0");
  }
  if (speculative_max_running < 0) {
    return invalid_argument("speculative_max_running = " + std::to_string(speculative_max_running) +
                            ", expected >= 0");
  }
  if (num_speculative_tokens < 0 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return invalid_argument("num_speculative_tokens = " + std::to_string(num_speculative_tokens) +
                            ", expected 0.." + std::to_string(kMaxSpeculativeTokens));
  }
  if (block_pool.block_size < 1) {
    return invalid_argument("block_size = " + std::to_string(block_pool.block_size) +
                            ", expected >= 1");
  }
  return ok_status();
}

int64_t max_tokens_limit(const SchedulerOptions& options, int64_t num_prompt_tokens) {
  const int64_t pool_tokens =
      static_cast<int64_t>(options.block_pool.num_blocks) * options.block_pool.block_size;
  return std::min(options.max_model_len, pool_tokens) - num_prompt_tokens;
}

Status check_sequence_fits(const SchedulerOptions& options, int64_t num_prompt_tokens,
                           int64_t max_tokens) {
  if (num_prompt_tokens < 1) return invalid_argument("the prompt is empty, expected >= 1 token");
  if (max_tokens < 1) {
    return invalid_argument("max_tokens = " + std::to_string(max_tokens) + ", expected >= 1");
  }
  const int64_t total = num_prompt_tokens + max_tokens;
  // Which of the two to change: the prompt when it leaves no room for a token, max_tokens
  // otherwise (the message then starts "max_tokens = ", which names the field to the client).
  if (num_prompt_tokens >= options.max_model_len) {
    return out_of_range("this model's maximum context length is " +
                        std::to_string(options.max_model_len) + " tokens, and the prompt has " +
                        std::to_string(num_prompt_tokens) +
                        ", which leaves no room for a completion token; shorten the prompt");
  }
  if (total > options.max_model_len) {
    return out_of_range("max_tokens = " + std::to_string(max_tokens) +
                        " is too large: this model's maximum context length is " +
                        std::to_string(options.max_model_len) + " tokens and the prompt has " +
                        std::to_string(num_prompt_tokens) + ", which leaves room for " +
                        std::to_string(options.max_model_len - num_prompt_tokens) +
                        "; lower max_tokens or shorten the prompt");
  }
  const int64_t bs = options.block_pool.block_size;
  const int64_t needed = blocks_for(total, bs);
  if (needed > options.block_pool.num_blocks) {
    return out_of_range("the request needs " + std::to_string(needed) + " KV blocks (" +
                        std::to_string(total) + " tokens) but the whole KV cache has " +
                        std::to_string(options.block_pool.num_blocks) + " blocks of " +
                        std::to_string(bs) + " tokens; shorten the prompt or lower max_tokens");
  }
  return ok_status();
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerOptions& options) {
  PS_RETURN_IF_ERROR(options.validate());
  PS_ASSIGN_OR_RETURN(BlockPool pool, BlockPool::create(options.block_pool));
  return std::unique_ptr<Scheduler>(new Scheduler(options, std::move(pool)));
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockPool pool)
    : options_(options),
      pool_(std::move(pool)),
      guard_(options.speculative_guard_drafts, options.speculative_min_acceptance) {}

Status Scheduler::add(SequenceSpec spec) {
  if (spec.prefilled_tail_block) {
    // Ours from here on: released on every error below, or if it does not fit the prompt.
    const int64_t bs = pool_.block_size();
    const int64_t n = static_cast<int64_t>(spec.prompt_tokens.size());
    if (n < 1 || spec.prefilled_tail_tokens < 1 || spec.prefilled_tail_tokens != (n - 1) % bs ||
        !pool_.prefix_caching_enabled()) {
      drop_prefilled_tail(spec);
    }
  }
  if (Status fits = check_sequence_fits(options_, static_cast<int64_t>(spec.prompt_tokens.size()),
                                        spec.max_tokens);
      !fits.ok()) {
    drop_prefilled_tail(spec);
    return fits;
  }
  if (sequences_.count(spec.id)) {
    drop_prefilled_tail(spec);
    return invalid_argument("sequence id " + std::to_string(spec.id) + " is already queued");
  }
  if (static_cast<int32_t>(waiting_.size()) >= options_.max_waiting_seqs) {
    drop_prefilled_tail(spec);
    return resource_exhausted("the waiting queue is full (" +
                              std::to_string(options_.max_waiting_seqs) +
                              " requests); retry later");
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = spec.prompt_tokens;
  seq->prefix_root = salted_root_hash(options_.prefix_root, spec.cache_salt);
  seq->spec = std::move(spec);
  seq->arrival_order = next_arrival_++;
  Sequence* raw = seq.get();
  sequences_.emplace(raw->spec.id, std::move(seq));
  waiting_.push_back(raw);  // newest arrival: back of the queue
  return ok_status();
}

const Sequence* Scheduler::find(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

void Scheduler::finish(SequenceId id, FinishReason reason) {
  PS_CHECK(!in_step_) << "finish() between schedule() and update()";
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  remove(*it->second, reason);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = static_cast<int32_t>(running_.size());
  s.num_waiting = num_waiting();
  s.num_blocks = pool_.num_blocks();
  s.num_used_blocks = pool_.num_used_blocks();
  s.num_free_blocks = pool_.num_free_blocks();
  s.num_cached_blocks = pool_.num_cached_blocks();
  s.num_preemptions = num_preemptions_;
  s.pool = pool_.counters();
  return s;
}

StepPlan Scheduler::schedule() {
  PS_CHECK(!in_step_) << "schedule() called twice without update()";
  StepPlan plan;
  plan.step_id = next_step_++;
  int64_t budget = options_.max_num_batched_tokens;
  drafting_ = drafting_step();
  plan.speculative = speculation_enabled();

  // 1. Running sequences, oldest first: their known tokens. Victims of preemption are always
  // newer than the sequence being grown, so nothing already in the plan is preempted.
  std::vector<DraftCandidate>& draft_candidates = draft_candidates_;  // reused: no allocation
  draft_candidates.clear();
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    const int64_t num_new = std::min(seq.num_tokens() - seq.num_computed_tokens,
                                     chunk_budget(seq, budget, running_.size() > 1));
    PS_CHECK(num_new > 0) << "running sequence " << seq.spec.id << " has nothing to compute";
    bool preempted_self = false;
    while (!grow_blocks(seq, tokens_to_cover(seq, num_new, 0))) {
      if (release_waiting_tails(nullptr)) continue;
      Sequence* victim = running_.back();
      plan.preempted.push_back(victim->spec.id);
      preempt(*victim);
      if (victim == &seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    if (usable_drafts(seq, num_new, num_new + options_.num_speculative_tokens) > 0) {
      draft_candidates.push_back({&seq, num_new, plan.chunks.size()});
    }
    add_chunk(seq, num_new, &plan);
    budget -= num_new;
    ++i;
  }

  // 2. Admissions, strictly FCFS, unless memory is short right now.
  if (plan.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int32_t>(running_.size()) < options_.max_num_seqs) {
      const size_t before = plan.chunks.size();
      if (!try_admit(*waiting_.front(), budget, &plan)) break;
      budget -= static_cast<int64_t>(plan.chunks[before].tokens.size());
    }
  }

  // 3. Drafts to verify, oldest first, from the budget the known tokens and admissions left:
  // they never keep a running sequence from its step or a waiting one from admission (taken
  // first, the oldest sequences' drafts could fill the budget for their whole lives). Nor do
  // they preempt: with blocks short, a sequence verifies fewer.
  for (const DraftCandidate& c : draft_candidates) {
    if (budget <= 0) break;
    int64_t num_drafts = usable_drafts(*c.seq, c.num_new, c.num_new + budget);
    while (num_drafts > 0 && !grow_blocks(*c.seq, tokens_to_cover(*c.seq, c.num_new, num_drafts))) {
      --num_drafts;
    }
    if (num_drafts == 0) continue;
    add_drafts(*c.seq, num_drafts, &plan.chunks[c.chunk], &plan);
    budget -= num_drafts;
  }
  in_step_ = !plan.empty();
  return plan;
}

int64_t Scheduler::capped_budget(int64_t budget, bool others_running) const {
  if (options_.max_prefill_chunk_tokens <= 0 || !others_running) return budget;
  return std::min<int64_t>(budget, options_.max_prefill_chunk_tokens);
}

int64_t Scheduler::chunk_budget(const Sequence& seq, int64_t budget, bool others_running) const {
  const int64_t capped = capped_budget(budget, others_running);
  if (options_.max_prompt_logprobs_tokens <= 0 || !seq.wants_prompt_logprobs()) return capped;
  return std::min<int64_t>(capped, options_.max_prompt_logprobs_tokens);
}

bool Scheduler::grow_blocks(Sequence& seq, int64_t num_tokens) {
  const int64_t need =
      blocks_for(num_tokens, pool_.block_size()) - static_cast<int64_t>(seq.block_table.size());
  if (need <= 0) return true;
  auto allocation = pool_.plan_allocation({}, static_cast<int32_t>(need));
  if (!allocation) return false;
  std::vector<BlockId> fresh = pool_.commit(*allocation);
  seq.block_table.insert(seq.block_table.end(), fresh.begin(), fresh.end());
  return true;
}

bool Scheduler::drafting_step() const {
  return speculation_enabled() &&
         (options_.speculative_max_running == 0 ||
          static_cast<int64_t>(running_.size()) <= options_.speculative_max_running);
}

int64_t Scheduler::usable_drafts(const Sequence& seq, int64_t num_new, int64_t budget) const {
  if (!drafting_) return 0;
  if (seq.num_computed_tokens + num_new != seq.num_tokens()) return 0;  // not sampling
  // Drafts occupy positions num_tokens .. num_tokens + drafts - 1, which must stay within the
  // sequence's reach (tokens past it are dropped by update(), as after max_tokens).
  const int64_t room = seq.max_length(options_.max_model_len) - seq.num_tokens();
  return std::max<int64_t>(
      0, std::min({static_cast<int64_t>(seq.drafts.size()), budget - num_new, room}));
}

int64_t Scheduler::tokens_to_cover(const Sequence& seq, int64_t num_new, int64_t num_drafts) const {
  const int64_t end = seq.num_computed_tokens + num_new + num_drafts;
  const bool samples = seq.num_computed_tokens + num_new == seq.num_tokens();
  if (!samples || options_.num_speculative_tokens <= 1) return end;
  // Drafting K tokens runs the MTP layer at K - 1 positions past the last computed one.
  return std::max(end, std::min(end + options_.num_speculative_tokens - 1,
                                seq.max_length(options_.max_model_len)));
}

bool Scheduler::waits_for_prompt_sibling(const Sequence& seq) const {
  if (!seq.spec.prompt_from || seq.admitted_once) return false;
  const Sequence* sibling = find(*seq.spec.prompt_from);
  if (sibling == nullptr) return false;
  // The request's prompt logprobs (choice 0's) go out with its first token, before any other
  // choice's tokens.
  if (sibling->spec.prompt_logprobs >= 0 && !sibling->prompt_logprobs_sent()) return true;
  if (!pool_.prefix_caching_enabled() || sibling->status != SequenceStatus::kRunning) {
    return false;
  }
  const int64_t bs = pool_.block_size();
  const int64_t shareable = (seq.num_prompt_tokens() - 1) / bs * bs;
  return sibling->num_computed_tokens < shareable;
}

bool Scheduler::try_admit(Sequence& seq, int64_t budget, StepPlan* plan) {
  if (waits_for_prompt_sibling(seq)) return false;
  const int64_t bs = pool_.block_size();
  // Look the known tokens up in the prefix cache. The last token is always computed (its
  // logits are needed), so at most (num_tokens - 1) / bs whole blocks can be shared.
  std::vector<BlockId> shared;
  if (pool_.prefix_caching_enabled()) {
    extend_block_hash_chain(seq.tokens, static_cast<int32_t>(bs), seq.prefix_root,
                            &seq.block_hashes, block_hash_lookahead());
    size_t max_hit_blocks = static_cast<size_t>((seq.num_tokens() - 1) / bs);
    // A hit gives KV, not logits: positions still owing prompt logprobs are computed.
    if (seq.wants_prompt_logprobs()) {
      max_hit_blocks = std::min(max_hit_blocks, static_cast<size_t>(seq.num_prompt_logprobs / bs));
    }
    std::span<const BlockHash> lookup(seq.block_hashes.data(),
                                      std::min(max_hit_blocks, seq.block_hashes.size()));
    shared = pool_.match_prefix(lookup);
  }
  // A prefilled partial block continues the prompt's full blocks only if all of them hit.
  int64_t tail_tokens = 0;
  if (seq.spec.prefilled_tail_block) {
    const bool usable = !seq.admitted_once && seq.num_tokens() == seq.num_prompt_tokens() &&
                        static_cast<int64_t>(shared.size()) == (seq.num_tokens() - 1) / bs;
    if (usable) {
      tail_tokens = seq.spec.prefilled_tail_tokens;
    } else {
      drop_prefilled_tail(seq.spec);
    }
  }
  const int64_t num_shared = static_cast<int64_t>(shared.size()) + (tail_tokens > 0 ? 1 : 0);
  const int64_t num_hit = static_cast<int64_t>(shared.size()) * bs + tail_tokens;
  const int64_t num_new =
      std::min(seq.num_tokens() - num_hit, chunk_budget(seq, budget, !running_.empty()));
  seq.drafts.clear();
  seq.num_computed_tokens = num_hit;
  const int64_t need = blocks_for(tokens_to_cover(seq, num_new, 0), bs) - num_shared;
  auto allocation = pool_.plan_allocation(shared, static_cast<int32_t>(need));
  if (!allocation && release_waiting_tails(&seq)) {
    allocation = pool_.plan_allocation(shared, static_cast<int32_t>(need));
  }
  if (!allocation) {
    seq.num_computed_tokens = 0;  // still waiting, with no KV (a prefilled tail kept)
    return false;
  }
  std::vector<BlockId> fresh = pool_.commit(*allocation);

  seq.block_table = std::move(shared);
  if (tail_tokens > 0) {
    seq.block_table.push_back(*seq.spec.prefilled_tail_block);  // its reference moves here
    seq.spec.prefilled_tail_block.reset();
    seq.spec.prefilled_tail_tokens = 0;
  }
  seq.block_table.insert(seq.block_table.end(), fresh.begin(), fresh.end());
  seq.num_computed_tokens = num_hit;
  seq.num_published_blocks = num_hit / bs;
  pool_.record_lookup(seq.num_tokens(), num_hit);
  if (!seq.admitted_once) {
    seq.admitted_once = true;
    seq.num_cached_prompt_tokens = std::min(num_hit, seq.num_prompt_tokens());
  }
  waiting_.pop_front();
  seq.status = SequenceStatus::kRunning;
  insert_running(&seq);
  add_chunk(seq, num_new, plan);
  return true;
}

void Scheduler::add_chunk(Sequence& seq, int64_t num_new, StepPlan* plan) {
  ScheduledChunk chunk;
  chunk.seq_id = seq.spec.id;
  chunk.start_pos = seq.num_computed_tokens;
  chunk.tokens.assign(seq.tokens.begin() + seq.num_computed_tokens,
                      seq.tokens.begin() + seq.num_computed_tokens + num_new);
  chunk.block_table = seq.block_table;
  chunk.sample = seq.num_computed_tokens + num_new == seq.num_tokens();
  chunk.sampling = &seq.spec.sampling;
  chunk.seed = seq.spec.seed;
  chunk.generated = seq.generated();
  chunk.prompt = seq.spec.prompt_tokens;
  if (seq.wants_prompt_logprobs()) {
    // Hits never pass num_prompt_logprobs (try_admit), so no position is skipped.
    PS_CHECK_LE(seq.num_computed_tokens, seq.num_prompt_logprobs) << "sequence " << seq.spec.id;
    if (seq.num_computed_tokens + num_new > seq.num_prompt_logprobs) {
      chunk.prompt_logprobs = seq.spec.prompt_logprobs;
      chunk.prompt_logprobs_from = seq.num_prompt_logprobs;
    }
  }
  if (speculation_enabled()) {
    if (!chunk.sample) {
      chunk.next_token = seq.tokens[static_cast<size_t>(seq.num_computed_tokens + num_new)];
    } else if (drafting_ && seq.num_tokens() + 1 < seq.max_length(options_.max_model_len)) {
      chunk.num_lookahead = options_.num_speculative_tokens;  // another step may follow
    }
  }
  plan->num_batched_tokens += num_new;
  if (num_new > 1 || seq.num_computed_tokens < seq.num_prompt_tokens()) {
    plan->num_prefill_tokens += num_new;
  }
  plan->chunks.push_back(std::move(chunk));
}

void Scheduler::add_drafts(const Sequence& seq, int64_t num_drafts, ScheduledChunk* chunk,
                           StepPlan* plan) const {
  chunk->drafts = std::span<const DraftToken>(seq.drafts).first(static_cast<size_t>(num_drafts));
  for (const DraftToken& d : chunk->drafts) chunk->tokens.push_back(d.token);
  chunk->block_table = seq.block_table;  // grown for the drafts
  plan->num_batched_tokens += num_drafts;
}

std::vector<SequenceUpdate> Scheduler::update(const StepPlan& plan, const StepResult& result) {
  PS_CHECK(in_step_ || plan.empty()) << "update() without a matching schedule()";
  PS_CHECK_EQ(result.chunks.size(), plan.chunks.size());
  in_step_ = false;
  std::vector<SequenceUpdate> updates;
  int64_t step_drafts = 0;  // for the guard
  int64_t step_accepted = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const ChunkResult& outcome = result.chunks[i];
    auto it = sequences_.find(chunk.seq_id);
    PS_CHECK(it != sequences_.end()) << "sequence " << chunk.seq_id << " vanished mid-step";
    Sequence& seq = *it->second;
    PS_CHECK_EQ(seq.num_computed_tokens, chunk.start_pos);
    seq.num_computed_tokens += chunk.num_known_tokens();
    if (!outcome.prompt_logprobs.empty()) {
      PS_CHECK(chunk.prompt_logprobs >= 0 && chunk.prompt_logprobs_from == seq.num_prompt_logprobs)
          << "sequence " << chunk.seq_id << ": prompt logprobs from " << chunk.prompt_logprobs_from
          << ", " << seq.num_prompt_logprobs << " so far";
      seq.prompt_logprobs.insert(seq.prompt_logprobs.end(), outcome.prompt_logprobs.begin(),
                                 outcome.prompt_logprobs.end());
      seq.num_prompt_logprobs += static_cast<int64_t>(outcome.prompt_logprobs.size());
    }
    if (!chunk.sample) {
      publish_computed_blocks(seq);
      continue;
    }
    PS_CHECK(!outcome.tokens.empty() && outcome.tokens.size() <= chunk.drafts.size() + 1)
        << "sequence " << chunk.seq_id << ": " << outcome.tokens.size() << " tokens for "
        << chunk.drafts.size() << " drafts";

    SequenceUpdate update;
    update.seq_id = seq.spec.id;
    update.num_cached_prompt_tokens = seq.num_cached_prompt_tokens;
    if (seq.spec.prompt_logprobs >= 0 && !seq.prompt_logprobs_sent()) {
      PS_CHECK_EQ(seq.num_prompt_logprobs, seq.num_prompt_tokens() - 1)
          << "sequence " << chunk.seq_id << " sampled before its prompt logprobs were complete";
      update.prompt_logprobs = std::move(seq.prompt_logprobs);  // its tokens follow below
      seq.prompt_logprobs = {};
    }
    update.num_drafts = static_cast<int32_t>(chunk.drafts.size());
    update.num_accepted_drafts = static_cast<int32_t>(outcome.tokens.size()) - 1;
    step_drafts += update.num_drafts;
    step_accepted += update.num_accepted_drafts;
    const auto& stop_ids = seq.spec.stop_token_ids;
    for (size_t j = 0; j < outcome.tokens.size() && !update.finish_reason; ++j) {
      const TokenId token = outcome.tokens[j].token;
      if (j + 1 < outcome.tokens.size()) {
        // An accepted draft: its KV was written by this step.
        PS_CHECK_EQ(token, chunk.drafts[j].token) << "sequence " << chunk.seq_id;
        ++seq.num_computed_tokens;
      }
      seq.tokens.push_back(token);
      update.tokens.push_back(outcome.tokens[j]);
      const std::vector<TokenId>& eos_ids = seq.spec.eos_token_ids;
      if (std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
        update.finish_reason = FinishReason::kStop;
        update.stop_token = token;
        update.stopped_on_eos = true;
      } else if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
        update.finish_reason = FinishReason::kStop;
        update.stop_token = token;
      } else if (seq.num_generated() >= seq.spec.max_tokens ||
                 seq.num_tokens() >= options_.max_model_len) {
        update.finish_reason = FinishReason::kLength;
      }
    }
    publish_computed_blocks(seq);
    if (update.finish_reason) {
      remove(seq, *update.finish_reason);
    } else {
      seq.drafts = outcome.drafts;
    }
    updates.push_back(std::move(update));
  }
  if (guard_.record(step_drafts, step_accepted) && speculation_enabled()) disable_speculation();
  return updates;
}

void Scheduler::abandon(const StepPlan& plan) {
  PS_CHECK(in_step_ || plan.empty()) << "abandon() without a matching schedule()";
  in_step_ = false;
}

void Scheduler::disable_speculation() {
  if (speculation_disabled_) return;
  speculation_disabled_ = true;
  // Hashes of blocks not published yet were built with lookahead for MTP KV these blocks
  // will not get: they are hashed again, without it, when they are published or looked up.
  for (auto& [id, seq] : sequences_) {
    const size_t keep = static_cast<size_t>(seq->num_published_blocks);
    if (seq->block_hashes.size() > keep) seq->block_hashes.resize(keep);
  }
}

void Scheduler::publish_computed_blocks(Sequence& seq) {
  if (!pool_.prefix_caching_enabled()) return;
  const int64_t bs = pool_.block_size();
  extend_block_hash_chain(seq.tokens, static_cast<int32_t>(bs), seq.prefix_root, &seq.block_hashes,
                          block_hash_lookahead());
  const int64_t num_full = std::min<int64_t>(seq.num_computed_tokens / bs,
                                             static_cast<int64_t>(seq.block_hashes.size()));
  for (int64_t b = seq.num_published_blocks; b < num_full; ++b) {
    // A false return means an identical block is already cached: ours stays private.
    if (pool_.publish(seq.block_table[b], seq.block_hashes[b]) &&
        options_.record_published_blocks) {
      published_.push_back(
          {seq.block_table[b], seq.block_hashes[b], (b + 1) * bs <= seq.num_prompt_tokens()});
    }
  }
  seq.num_published_blocks = std::max(seq.num_published_blocks, num_full);
}

void Scheduler::drop_prefilled_tail(SequenceSpec& spec) {
  if (!spec.prefilled_tail_block) return;
  const BlockId block = *spec.prefilled_tail_block;
  pool_.release({&block, 1});
  spec.prefilled_tail_block.reset();
  spec.prefilled_tail_tokens = 0;
}

bool Scheduler::release_waiting_tails(const Sequence* keep) {
  bool released = false;
  for (Sequence* waiting : waiting_) {
    if (waiting == keep || !waiting->spec.prefilled_tail_block) continue;
    drop_prefilled_tail(waiting->spec);
    released = true;
  }
  return released;
}

void Scheduler::release_blocks(Sequence& seq) {
  // Last block first: the tail of the free list is reused last, so the prefix stays cached
  // longest.
  std::vector<BlockId> reversed(seq.block_table.rbegin(), seq.block_table.rend());
  pool_.release(reversed);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_published_blocks = 0;
  seq.drafts.clear();
}

void Scheduler::preempt(Sequence& seq) {
  PS_CHECK(!running_.empty() && running_.back() == &seq);
  running_.pop_back();
  release_blocks(seq);
  seq.status = SequenceStatus::kWaiting;
  ++seq.num_preemptions;
  ++num_preemptions_;
  insert_waiting(&seq);
}

void Scheduler::remove(Sequence& seq, FinishReason reason) {
  release_blocks(seq);
  drop_prefilled_tail(seq.spec);
  if (seq.status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), &seq));
  } else if (seq.status == SequenceStatus::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &seq));
  }
  seq.status = SequenceStatus::kFinished;
  seq.finish_reason = reason;
  const SequenceId id = seq.spec.id;
  sequences_.erase(id);  // destroys seq
}

void Scheduler::insert_waiting(Sequence* seq) {
  auto pos = std::lower_bound(
      waiting_.begin(), waiting_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  waiting_.insert(pos, seq);
}

void Scheduler::insert_running(Sequence* seq) {
  auto pos = std::lower_bound(
      running_.begin(), running_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  running_.insert(pos, seq);
}

int64_t Scheduler::cached_prefix_blocks(std::span<const BlockHash> chain) const {
  return static_cast<int64_t>(pool_.match_prefix(chain).size());
}

int64_t Scheduler::adopt_blocks(std::span<const BlockHash> cached,
                                std::span<const BlockHash> loaded,
                                const std::function<bool(size_t, BlockId)>& fill) {
  const Reservation reservation = reserve_blocks(cached, static_cast<int64_t>(loaded.size()));
  int64_t filled = 0;
  while (filled < static_cast<int64_t>(reservation.fresh.size()) &&
         fill(static_cast<size_t>(filled), reservation.fresh[static_cast<size_t>(filled)])) {
    ++filled;
  }
  return commit_reservation(reservation, loaded, filled);
}

Scheduler::Reservation Scheduler::reserve_blocks(std::span<const BlockHash> cached, int64_t count) {
  PS_CHECK(!in_step_) << "reserve_blocks() between schedule() and update()";
  Reservation reservation;
  if (!pool_.prefix_caching_enabled() || count <= 0) return reservation;
  std::vector<BlockId> shared = pool_.match_prefix(cached);
  if (shared.size() != cached.size()) return reservation;  // the chain broke meanwhile
  // Referencing the cached part keeps it from being evicted for the new blocks.
  auto plan = pool_.plan_allocation(shared, static_cast<int32_t>(count));
  if (!plan) {
    int64_t free_others = pool_.num_free_blocks();
    for (BlockId b : shared) free_others -= pool_.ref_count(b) == 0 ? 1 : 0;
    count = std::min<int64_t>(count, std::max<int64_t>(free_others, 0));
    plan = pool_.plan_allocation(shared, static_cast<int32_t>(count));
    if (!plan || count == 0) return reservation;
  }
  reservation.fresh = pool_.commit(*plan);
  reservation.cached = std::move(shared);
  return reservation;
}

int64_t Scheduler::commit_reservation(const Reservation& reservation,
                                      std::span<const BlockHash> loaded, int64_t filled) {
  PS_CHECK(!in_step_) << "commit_reservation() between schedule() and update()";
  filled = std::min<int64_t>({filled, static_cast<int64_t>(reservation.fresh.size()),
                              static_cast<int64_t>(loaded.size())});
  for (int64_t i = 0; i < filled; ++i) {
    (void)pool_.publish(reservation.fresh[static_cast<size_t>(i)], loaded[static_cast<size_t>(i)]);
  }
  // Release last-first (the prefix stays cached longest); unfilled blocks go first.
  std::vector<BlockId> order(reservation.fresh.rbegin(), reservation.fresh.rend());
  order.insert(order.end(), reservation.cached.rbegin(), reservation.cached.rend());
  pool_.release(order);
  return filled;
}

std::vector<Scheduler::PublishedBlock> Scheduler::take_published_blocks() {
  std::vector<PublishedBlock> out;
  out.swap(published_);
  return out;
}

}  // namespace peerserve
