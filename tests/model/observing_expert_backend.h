// An ExpertBackend for tests: delegates to another backend and records what the model
// asks of it (the microbatch slot of each call state, the layer and row count of each
// dispatch); can claim to be collective (as the expert-parallel backend is, which puts the
// model and the executor in lock-step) and can fail its compute stage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/expert_backend.h"

namespace peerserve::testing {

class ObservingBackend final : public ExpertBackend {
 public:
  explicit ObservingBackend(std::shared_ptr<ExpertBackend> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Call> new_call(int slot) override {
    slots.push_back(slot);
    return inner_->new_call(slot);
  }
  Status dispatch(const RoutedTokens& tokens, Call& call) override {
    layers.push_back(tokens.layer);
    tokens_seen.push_back(tokens.num_tokens);
    return inner_->dispatch(tokens, call);
  }
  Status compute(Call& call) override {
    if (fail_compute) return unavailable("expert backend: rank 1 lost");
    return inner_->compute(call);
  }
  Status combine(Call& call, std::span<float> out) override { return inner_->combine(call, out); }
  bool collective() const override { return is_collective; }

  // Dispatches of `layer` so far.
  int64_t dispatches(int64_t layer) const {
    return std::count(layers.begin(), layers.end(), layer);
  }
  void clear() {
    slots.clear();
    layers.clear();
    tokens_seen.clear();
  }

  bool is_collective = false;
  bool fail_compute = false;
  std::vector<int> slots;
  std::vector<int64_t> layers, tokens_seen;

 private:
  std::shared_ptr<ExpertBackend> inner_;
};

}  // namespace peerserve::testing
