#include "plan/placement/synthetic_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "base/splitmix64.h"

namespace peerserve::plan {
namespace {

// xoshiro256** seeded by splitmix64: much faster than mt19937_64 for the per-expert shuffles
// that dominate trace generation, and its output is fixed by the seed on every platform.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& word : state_) word = splitmix64_next(seed);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Uniform in [0, n), by Lemire's multiply-shift (bias below 2^-32 for n < 2^32).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

template <typename T>
void shuffle(std::vector<T>& values, Xoshiro256& rng) {
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[rng.below(i)]);
}

Status check_range(const char* name, double value, double lo, double hi) {
  if (!(value >= lo && value <= hi)) {
    return invalid_argument(std::string("synthetic routing: ") + name + " = " +
                            std::to_string(value) + ", expected in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  }
  return ok_status();
}

// One top-k draw with inclusion probabilities pi (by rank) over a fresh random order of ranks:
// cumulative sums cross the points u, u+1, ..., u+k-1 exactly once per selected rank.
class SystematicSampler {
 public:
  SystematicSampler(std::vector<double> pi, int top_k)
      : pi_(std::move(pi)), top_k_(top_k), order_(pi_.size()) {
    std::iota(order_.begin(), order_.end(), 0);
  }

  // Writes top_k distinct ranks to `ranks`.
  void draw(Xoshiro256& rng, std::vector<int>& ranks) {
    shuffle(order_, rng);
    ranks.clear();
    double next = rng.uniform01();
    double cumulative = 0.0;
    for (int rank : order_) {
      cumulative += pi_[static_cast<size_t>(rank)];
      if (cumulative > next && static_cast<int>(ranks.size()) < top_k_) {
        ranks.push_back(rank);
        next += 1.0;
      }
    }
    // Rounding can leave the last point a hair beyond the total; take the last unpicked ranks.
    for (auto it = order_.rbegin(); static_cast<int>(ranks.size()) < top_k_; ++it) {
      if (std::find(ranks.begin(), ranks.end(), *it) == ranks.end()) ranks.push_back(*it);
    }
  }

 private:
  std::vector<double> pi_;
  int top_k_;
  std::vector<int> order_;
};

}  // namespace

Status SyntheticRoutingOptions::validate() const {
  PS_RETURN_IF_ERROR(check_range("num_experts", num_experts, 1, 65536));
  PS_RETURN_IF_ERROR(check_range("top_k", top_k, 1, num_experts));
  PS_RETURN_IF_ERROR(check_range("num_dense_layers", num_dense_layers, 0, 100000));
  PS_RETURN_IF_ERROR(check_range("num_moe_layers", num_moe_layers, 1, 100000));
  PS_RETURN_IF_ERROR(check_range("num_requests", num_requests, 1, 10000000));
  PS_RETURN_IF_ERROR(check_range("min_prefill_tokens", min_prefill_tokens, 1, 10000000));
  PS_RETURN_IF_ERROR(
      check_range("max_prefill_tokens", max_prefill_tokens, min_prefill_tokens, 10000000));
  PS_RETURN_IF_ERROR(check_range("decode_steps", decode_steps, 0, 10000000));
  PS_RETURN_IF_ERROR(check_range("popularity_skew", popularity_skew, 0, 100));
  PS_RETURN_IF_ERROR(check_range("token_repeat", token_repeat, 0, 1));
  PS_RETURN_IF_ERROR(check_range("layer_follow", layer_follow, 0, 1 - token_repeat));
  PS_RETURN_IF_ERROR(check_range("num_task_profiles", num_task_profiles, 1, 1024));
  PS_RETURN_IF_ERROR(check_range("task_variation", task_variation, 0, 1));
  return ok_status();
}

std::vector<double> zipf_inclusion_probabilities(int num_experts, int top_k, double skew) {
  PS_CHECK(top_k >= 1 && top_k <= num_experts) << top_k << " of " << num_experts;
  const auto n = static_cast<size_t>(num_experts);
  std::vector<double> weight(n);
  for (size_t i = 0; i < n; ++i) weight[i] = std::pow(static_cast<double>(i + 1), -skew);
  // Water-filling: ranks whose share would exceed 1 are capped at 1 and the rest of top_k is
  // spread over the others in proportion to their weights. Weights fall with rank, so the
  // capped ranks are always a prefix.
  std::vector<double> pi(n, 0.0);
  size_t capped = 0;
  while (true) {
    const double rest =
        std::accumulate(weight.begin() + static_cast<std::ptrdiff_t>(capped), weight.end(), 0.0);
    const double budget = top_k - static_cast<double>(capped);
    if (capped < n && weight[capped] * budget / rest > 1.0) {
      ++capped;
      continue;
    }
    for (size_t i = 0; i < n; ++i) pi[i] = i < capped ? 1.0 : weight[i] * budget / rest;
    return pi;
  }
}

Result<double> zipf_skew_for_max_over_mean(int num_experts, int top_k, double max_over_mean) {
  if (top_k < 1 || top_k > num_experts) {
    return invalid_argument("top_k = " + std::to_string(top_k) + " for " +
                            std::to_string(num_experts) + " experts, expected 1..num_experts");
  }
  const double limit = static_cast<double>(num_experts) / top_k;
  if (!(max_over_mean >= 1.0 && max_over_mean <= limit)) {
    return invalid_argument("max/mean expert load " + std::to_string(max_over_mean) +
                            ", expected in [1, " + std::to_string(limit) +
                            "] (an expert is selected by at most every token)");
  }
  const double mean = static_cast<double>(top_k) / num_experts;
  const auto ratio = [&](double s) {
    return zipf_inclusion_probabilities(num_experts, top_k, s).front() / mean;
  };
  double lo = 0.0;
  double hi = 1.0;
  while (ratio(hi) < max_over_mean && hi < 64.0) hi *= 2.0;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ratio(mid) < max_over_mean ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Result<SyntheticRouting> generate_synthetic_routing(const SyntheticRoutingOptions& options) {
  PS_RETURN_IF_ERROR(options.validate());
  Xoshiro256 rng(options.seed);
  const int num_experts = options.num_experts;
  const int layers = options.num_moe_layers;
  const int k = options.top_k;

  SyntheticRouting out;
  // Popularity orders: profile 0 is a random permutation per layer; other profiles reshuffle
  // a random subset of its ranks among themselves.
  out.expert_at_rank.resize(static_cast<size_t>(options.num_task_profiles));
  for (size_t p = 0; p < out.expert_at_rank.size(); ++p) {
    out.expert_at_rank[p].resize(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      std::vector<uint16_t>& order = out.expert_at_rank[p][static_cast<size_t>(l)];
      if (p == 0) {
        order.resize(static_cast<size_t>(num_experts));
        std::iota(order.begin(), order.end(), 0);
        shuffle(order, rng);
      } else {
        order = out.expert_at_rank[0][static_cast<size_t>(l)];
        std::vector<int> moved(static_cast<size_t>(num_experts));
        std::iota(moved.begin(), moved.end(), 0);
        shuffle(moved, rng);
        moved.resize(static_cast<size_t>(std::lround(options.task_variation * num_experts)));
        std::vector<uint16_t> experts;
        for (int rank : moved) experts.push_back(order[static_cast<size_t>(rank)]);
        shuffle(experts, rng);
        for (size_t i = 0; i < moved.size(); ++i) order[static_cast<size_t>(moved[i])] = experts[i];
      }
    }
  }

  SystematicSampler sampler(zipf_inclusion_probabilities(num_experts, k, options.popularity_skew),
                            k);
  std::vector<int> ranks;
  // Sets are kept as popularity ranks, which the layer-follow map preserves.
  std::vector<std::vector<int>> previous_token(static_cast<size_t>(layers));
  std::vector<int> previous_layer;
  out.requests.reserve(static_cast<size_t>(options.num_requests));
  for (int r = 0; r < options.num_requests; ++r) {
    const auto profile = static_cast<size_t>(rng.below(options.num_task_profiles));
    out.request_profile.push_back(static_cast<int>(profile));
    RequestRouting request;
    request.num_decoder_layers = options.num_dense_layers + layers;
    for (int l = 0; l < layers; ++l) request.moe_layers.push_back(options.num_dense_layers + l);
    request.top_k = k;
    request.prefill_tokens =
        options.min_prefill_tokens +
        static_cast<int>(rng.below(options.max_prefill_tokens - options.min_prefill_tokens + 1));
    request.decode_steps = options.decode_steps;
    request.selections.assign(static_cast<size_t>(layers), {});
    for (auto& row : request.selections) {
      row.reserve(static_cast<size_t>(request.num_tokens()) * k);
    }
    for (int t = 0; t < request.num_tokens(); ++t) {
      for (int l = 0; l < layers; ++l) {
        const double u = rng.uniform01();
        if (t > 0 && u < options.token_repeat) {
          ranks = previous_token[static_cast<size_t>(l)];
        } else if (l > 0 && u >= options.token_repeat &&
                   u < options.token_repeat + options.layer_follow) {
          ranks = previous_layer;  // same ranks at this layer = the per-layer expert map
        } else {
          sampler.draw(rng, ranks);
        }
        for (int rank : ranks) {
          request.selections[static_cast<size_t>(l)].push_back(
              out.expert_at_rank[profile][static_cast<size_t>(l)][static_cast<size_t>(rank)]);
        }
        previous_token[static_cast<size_t>(l)] = ranks;
        previous_layer = ranks;
      }
    }
    out.requests.push_back(std::move(request));
  }
  return out;
}

}  // namespace peerserve::plan
