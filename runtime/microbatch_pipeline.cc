#include "runtime/microbatch_pipeline.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <utility>

#include "model/expert_backend.h"

namespace peerserve {
namespace {

// Whether the state's next stage would wait on other processes.
bool would_wait(const ForwardState& state, const ExpertBackend& backend) {
  const ForwardStage stage = state.stage();
  if (stage != ForwardStage::kExperts && stage != ForwardStage::kCombine) return false;
  return state.expert_call != nullptr && !backend.ready(*state.expert_call);
}

// Stages after which a microbatch hands over: its next stage involves the other processes.
bool hand_over_before(ForwardStage stage) {
  return stage == ForwardStage::kExperts || stage == ForwardStage::kCombine;
}

}  // namespace

size_t microbatch_split_point(std::span<const SequenceChunk> chunks) {
  int64_t total = 0;
  for (const SequenceChunk& c : chunks) total += static_cast<int64_t>(c.tokens.size());
  // The split that balances the rows best; on a tie the first microbatch takes more.
  size_t best = chunks.size();
  int64_t best_imbalance = total, first = 0;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    first += static_cast<int64_t>(chunks[i].tokens.size());
    const int64_t imbalance = std::abs(2 * first - total);
    if (imbalance <= best_imbalance) {
      best = i + 1;
      best_imbalance = imbalance;
    }
  }
  return best;
}

MicrobatchPipeline::MicrobatchPipeline(DeepseekModel* model, MicrobatchSplit split)
    : model_(model), split_policy_(split) {
  for (int slot = 0; slot < 2; ++slot) states_[slot] = model_->new_forward_state(slot);
  states_[1]->interleaved = true;  // only ever runs beside slot 0
}

uint64_t MicrobatchPipeline::proposal() const {
  return split_policy_ == MicrobatchSplit::kAlways ? ~uint64_t{0} : policy_.plan();
}

void MicrobatchPipeline::follow_agreement(uint64_t leader_proposal, int64_t group_tokens) {
  agreed_ = true;
  agreed_plan_ = leader_proposal;
  agreed_tokens_ = group_tokens;
}

Status MicrobatchPipeline::forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache,
                                   ForwardOutput* out) {
  ++stats_.steps;
  int64_t rows = 0;
  for (const SequenceChunk& c : chunks) rows += static_cast<int64_t>(c.tokens.size());
  // The step's size and plan: the group's under lock-step, else this engine's own.
  // With a collective expert backend every rank runs both microbatches, one possibly empty,
  // so that the ranks' exchanges pair up slot by slot; whether they split at all is the
  // agreed plan's, the same on every rank (without an agreement: always, as every rank does).
  const bool collective = model_->expert_backend()->collective();
  const int64_t tokens = agreed_ ? agreed_tokens_ : rows;
  const uint64_t plan = agreed_ ? agreed_plan_ : collective ? ~uint64_t{0} : proposal();
  agreed_ = false;
  const bool wanted = (plan >> MicrobatchPolicy::bucket_of(tokens)) & 1;

  const size_t split = microbatch_split_point(chunks);
  const bool can_split = split < chunks.size() || collective;
  const auto start = std::chrono::steady_clock::now();
  Status status;
  states_[0]->interleaved = can_split && wanted;
  if (can_split && wanted) {
    ++stats_.split_steps;
    status = forward_split(chunks, split, cache, out);
  } else {
    if (can_split) ++stats_.whole_steps;
    status = model_->forward(chunks, cache, *states_[0], out);
  }
  if (status.ok() && can_split) {
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    policy_.record(tokens, wanted, seconds.count());
  }
  return status;
}

Status MicrobatchPipeline::forward_split(std::span<const SequenceChunk> chunks, size_t split,
                                         LatentKvCache& cache, ForwardOutput* out) {
  // The whole step is checked first (two halves writing one block pass each half's check).
  PS_RETURN_IF_ERROR(model_->validate_forward(chunks, cache));
  PS_RETURN_IF_ERROR(model_->begin_forward(*states_[0], chunks.first(split), cache));
  if (Status s = model_->begin_forward(*states_[1], chunks.subspan(split), cache); !s.ok()) {
    model_->abandon(*states_[0]);
    return s;
  }
  PS_RETURN_IF_ERROR(drive());
  // The first microbatch's output becomes the step's (a swap: no copy, and no third buffer
  // of logits), and the second's rows follow it.
  model_->take_output(*states_[0], out);
  model_->take_output(*states_[1], &second_output_);
  const ForwardOutput& b = second_output_;
  const int64_t base = out->num_rows();
  const int64_t hidden_base = out->hidden_row_offsets.back();
  out->logits.insert(out->logits.end(), b.logits.begin(), b.logits.end());
  out->hidden.insert(out->hidden.end(), b.hidden.begin(), b.hidden.end());
  for (size_t i = 1; i < b.row_offsets.size(); ++i) {
    out->row_offsets.push_back(base + b.row_offsets[i]);
  }
  for (size_t i = 1; i < b.hidden_row_offsets.size(); ++i) {
    out->hidden_row_offsets.push_back(hidden_base + b.hidden_row_offsets[i]);
  }
  return ok_status();
}

Status MicrobatchPipeline::drive() {
  // Held for the whole drive: the model's reference could be replaced by a rebalance.
  const std::shared_ptr<const ExpertBackend> held = model_->expert_backend();
  const ExpertBackend& backend = *held;
  int current = 0;
  auto done = [&](int i) { return states_[i]->stage() == ForwardStage::kDone; };
  while (!done(0) || !done(1)) {
    const int other = 1 - current;
    if (done(current)) {
      current = other;
      continue;
    }
    if (would_wait(*states_[current], backend) && !done(other) &&
        !would_wait(*states_[other], backend)) {
      ++stats_.waits_avoided;
      ++stats_.switches;
      current = other;
      continue;
    }
    Status s = model_->run_stage(*states_[current]);
    if (!s.ok()) {
      // The failed state is idle already; the other must not be left half-way.
      model_->abandon(*states_[other]);
      return s;
    }
    if (!done(other) && hand_over_before(states_[current]->stage())) {
      ++stats_.switches;
      current = other;
    }
  }
  return ok_status();
}

}  // namespace peerserve
