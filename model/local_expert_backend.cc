#include "model/local_expert_backend.h"

#include <cstring>
#include <string>

#include "kernels/activation.h"
#include "kernels/vector_ops.h"

namespace peerserve {

LocalExpertBackend::LocalExpertBackend(std::vector<std::span<const MlpWeights>> experts_by_layer,
                                       kernels::ActivationPrecision precision, ThreadPool* pool)
    : experts_by_layer_(std::move(experts_by_layer)), precision_(precision), pool_(pool) {}

Status LocalExpertBackend::run(const RoutedTokens& tokens, std::span<float> out) {
  if (tokens.layer < 0 || tokens.layer >= static_cast<int64_t>(experts_by_layer_.size()) ||
      experts_by_layer_[tokens.layer].empty()) {
    return invalid_argument("expert backend: layer " + std::to_string(tokens.layer) +
                            " has no routed experts");
  }
  std::span<const MlpWeights> experts = experts_by_layer_[tokens.layer];
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  const int64_t t_count = tokens.num_tokens, top_k = tokens.top_k, hidden = tokens.hidden_size;
  const int64_t pairs = t_count * top_k;
  if (static_cast<int64_t>(out.size()) != t_count * hidden ||
      static_cast<int64_t>(tokens.activations.size()) != t_count * hidden ||
      static_cast<int64_t>(tokens.expert_ids.size()) != pairs ||
      static_cast<int64_t>(tokens.weights.size()) != pairs) {
    return invalid_argument("expert backend: inconsistent sizes for " + std::to_string(t_count) +
                            " tokens x top " + std::to_string(top_k));
  }
  for (int64_t i = 0; i < pairs; ++i) {
    if (tokens.expert_ids[i] < 0 || tokens.expert_ids[i] >= num_experts) {
      return invalid_argument("expert backend: expert id " + std::to_string(tokens.expert_ids[i]) +
                              " outside [0, " + std::to_string(num_experts) + ")");
    }
  }
  const int64_t inter = experts[0].gate.rows;

  // Slots: the pairs sorted by expert (stable), so each expert's tokens are contiguous.
  std::vector<int64_t> first_slot(num_experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) ++first_slot[tokens.expert_ids[i] + 1];
  for (int64_t e = 0; e < num_experts; ++e) first_slot[e + 1] += first_slot[e];
  std::vector<int64_t> next = first_slot;
  slot_of_pair_.resize(pairs);
  x_.resize(pairs * hidden);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t slot = next[tokens.expert_ids[i]]++;
    slot_of_pair_[i] = slot;
    std::memcpy(x_.data() + slot * hidden, tokens.activations.data() + (i / top_k) * hidden,
                hidden * sizeof(float));
  }

  gate_.resize(pairs * inter);
  up_.resize(pairs * inter);
  down_.resize(pairs * hidden);
  std::vector<kernels::MatmulBf16Args> problems;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first_slot[e + 1] - first_slot[e];
    if (m == 0) continue;
    for (int which = 0; which < 2; ++which) {
      kernels::MatmulBf16Args p;
      p.x = x_.data() + first_slot[e] * hidden;
      p.w = which == 0 ? experts[e].gate.data : experts[e].up.data;
      p.y = (which == 0 ? gate_.data() : up_.data()) + first_slot[e] * inter;
      p.m = m;
      p.n = inter;
      p.k = hidden;
      problems.push_back(p);
    }
  }
  kernels::grouped_matmul_bf16(problems, precision_, pool_);
  kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), pairs * inter);
  problems.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first_slot[e + 1] - first_slot[e];
    if (m == 0) continue;
    kernels::MatmulBf16Args p;
    p.x = gate_.data() + first_slot[e] * inter;
    p.w = experts[e].down.data;
    p.y = down_.data() + first_slot[e] * hidden;
    p.m = m;
    p.n = hidden;
    p.k = inter;
    problems.push_back(p);
  }
  kernels::grouped_matmul_bf16(problems, precision_, pool_);

  // Combine in top-k order per token.
  std::fill(out.begin(), out.end(), 0.0f);
  for (int64_t i = 0; i < pairs; ++i) {
    kernels::axpy(tokens.weights[i], down_.data() + slot_of_pair_[i] * hidden,
                  out.data() + (i / top_k) * hidden, hidden);
  }
  return ok_status();
}

}  // namespace peerserve
