// ExpertLoadRecorder: an ExpertBackend that counts, per MoE layer and logical expert, the
// (token, expert) selections that pass through it, and otherwise hands every stage to the
// backend it wraps. The counts feed the expert-placement rebalance (EPLB) and /metrics.
//
// Thread-safety: the engine thread drives the stages; counts() and take() may be called
// from any thread (relaxed atomics: a snapshot may straddle a step).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/expert_backend.h"

namespace peerserve {

class ExpertLoadRecorder final : public ExpertBackend {
 public:
  // Layers 0 .. num_layers-1 (include the MTP layer's index if it runs), experts
  // 0 .. num_experts-1.
  ExpertLoadRecorder(std::shared_ptr<ExpertBackend> inner, int64_t num_layers, int64_t num_experts);

  std::unique_ptr<Call> new_call(int slot) override { return inner_->new_call(slot); }
  Status dispatch(const RoutedTokens& tokens, Call& call) override;
  Status compute(Call& call) override { return inner_->compute(call); }
  Status combine(Call& call, std::span<float> out) override { return inner_->combine(call, out); }
  bool ready(const Call& call) const override { return inner_->ready(call); }
  bool collective() const override { return inner_->collective(); }

  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }
  // [layer * num_experts + expert]: selections since creation (or the last take()).
  std::vector<int64_t> counts() const;
  // The same, and the counters restart from zero.
  std::vector<int64_t> take();

  const std::shared_ptr<ExpertBackend>& inner() const { return inner_; }

 private:
  std::shared_ptr<ExpertBackend> inner_;
  int64_t num_layers_, num_experts_;
  std::unique_ptr<std::atomic<int64_t>[]> counts_;
};

// total[i] += part[i], growing total to part's size: counts of several recorders (across
// rebalances, or the ranks of an expert-parallel group) added up.
inline void add_expert_counts(std::vector<int64_t>& total, std::span<const int64_t> part) {
  if (total.size() < part.size()) total.resize(part.size(), 0);
  for (size_t i = 0; i < part.size(); ++i) total[i] += part[i];
}

}  // namespace peerserve
