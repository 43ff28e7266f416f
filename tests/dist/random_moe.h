// A small random MoE (bf16 expert weights) and random routed tokens for the expert-parallel
// tests and the MPI test driver. Everything is a function of the seeds, so every rank of a
// multi-process test builds the same model and can rebuild any rank's tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dist/expert_placement.h"
#include "kernels/int8_matrix.h"
#include "model/deepseek_weights.h"
#include "model/expert_backend.h"
#include "tensor/float_convert.h"

namespace peerserve::dist::testing {

struct RandomMoe {
  int64_t hidden = 0, inter = 0;
  int num_experts = 0, top_k = 0;
  std::vector<int> moe_layers;                   // decoder layers with experts
  std::vector<std::vector<MlpWeights>> experts;  // [decoder layer][expert]
  std::vector<std::shared_ptr<std::vector<bf16>>> storage;

  RandomMoe(int64_t hidden_size, int64_t intermediate, int experts_per_layer, int k,
            std::vector<int> layers, uint64_t seed)
      : hidden(hidden_size),
        inter(intermediate),
        num_experts(experts_per_layer),
        top_k(k),
        moe_layers(std::move(layers)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int num_layers = *std::max_element(moe_layers.begin(), moe_layers.end()) + 1;
    experts.resize(num_layers);
    auto matrix = [&](int64_t rows, int64_t cols) {
      auto data = std::make_shared<std::vector<bf16>>(rows * cols);
      const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
      for (bf16& v : *data) v = float_to_bf16(scale * normal(rng));
      storage.push_back(data);
      return LinearWeight{data->data(), rows, cols, data, nullptr, nullptr, nullptr};
    };
    for (int layer : moe_layers) {
      for (int e = 0; e < num_experts; ++e) {
        MlpWeights w;
        w.gate = matrix(inter, hidden);
        w.up = matrix(inter, hidden);
        w.down = matrix(hidden, inter);
        experts[layer].push_back(w);
      }
    }
  }

  // Adds every expert's INT8 forms (the fused gate/up and down, round to nearest), and with
  // `compensation` a random error compensation on each down projection.
  void add_int8(bool compensation, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (int layer : moe_layers) {
      for (MlpWeights& w : experts[layer]) {
        auto gate_up = kernels::PackedInt8Matrix::quantize_gate_up(
            {w.gate.data, w.gate.rows, w.gate.cols, 0}, {w.up.data, w.up.rows, w.up.cols, 0});
        auto down = kernels::PackedInt8Matrix::quantize(
            kernels::MatrixView<bf16>{w.down.data, w.down.rows, w.down.cols, 0});
        PS_CHECK(gate_up.ok() && down.ok());
        w.gate_up_int8 =
            std::make_shared<const kernels::PackedInt8Matrix>(std::move(gate_up).value());
        w.down.int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(down).value());
        if (compensation) {
          auto c = std::make_shared<std::vector<float>>(w.down.rows);
          for (float& v : *c) v = normal(rng);
          w.down.int8_compensation = std::move(c);
        }
      }
    }
  }

  std::vector<std::span<const MlpWeights>> all_experts() const {
    std::vector<std::span<const MlpWeights>> spans(experts.size());
    for (size_t l = 0; l < experts.size(); ++l) spans[l] = experts[l];
    return spans;
  }

  // The weights `rank` holds under `placement`, [decoder layer][local slot].
  std::vector<std::vector<MlpWeights>> local_experts(const ExpertPlacement& placement,
                                                     int rank) const {
    std::vector<std::vector<MlpWeights>> local(experts.size());
    for (int layer : moe_layers) {
      for (int logical : placement.local_experts(layer, rank)) {
        local[layer].push_back(experts[layer][logical]);
      }
    }
    return local;
  }
};

// Routed tokens with their storage.
struct TokenBatch {
  std::vector<float> activations, weights;
  std::vector<int32_t> expert_ids;
  RoutedTokens tokens;

  TokenBatch(const RandomMoe& moe, int64_t layer, int64_t num_tokens, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
    activations.resize(num_tokens * moe.hidden);
    for (float& v : activations) v = normal(rng);
    std::vector<int32_t> all(moe.num_experts);
    for (int e = 0; e < moe.num_experts; ++e) all[e] = e;
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < moe.top_k; ++j) {
        expert_ids.push_back(all[j]);
        weights.push_back(uniform(rng));
      }
    }
    tokens.layer = layer;
    tokens.num_tokens = num_tokens;
    tokens.hidden_size = moe.hidden;
    tokens.top_k = moe.top_k;
    tokens.activations = activations;
    tokens.expert_ids = expert_ids;
    tokens.weights = weights;
  }
};

}  // namespace peerserve::dist::testing
