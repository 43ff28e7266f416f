#include "model/expert_load_recorder.h"

namespace peerserve {

ExpertLoadRecorder::ExpertLoadRecorder(std::shared_ptr<ExpertBackend> inner, int64_t num_layers,
                                       int64_t num_experts)
    : inner_(std::move(inner)),
      num_layers_(num_layers),
      num_experts_(num_experts),
      counts_(std::make_unique<std::atomic<int64_t>[]>(num_layers * num_experts)) {
  for (int64_t i = 0; i < num_layers * num_experts; ++i) counts_[i] = 0;
}

Status ExpertLoadRecorder::dispatch(const RoutedTokens& tokens, Call& call) {
  if (tokens.layer >= 0 && tokens.layer < num_layers_) {
    std::atomic<int64_t>* row = counts_.get() + tokens.layer * num_experts_;
    for (const int32_t id : tokens.expert_ids) {
      if (id >= 0 && id < num_experts_) row[id].fetch_add(1, std::memory_order_relaxed);
    }
  }
  return inner_->dispatch(tokens, call);
}

std::vector<int64_t> ExpertLoadRecorder::counts() const {
  std::vector<int64_t> out(num_layers_ * num_experts_);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<int64_t> ExpertLoadRecorder::take() {
  std::vector<int64_t> out(num_layers_ * num_experts_);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = counts_[i].exchange(0, std::memory_order_relaxed);
  return out;
}

}  // namespace peerserve
