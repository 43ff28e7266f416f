#include "runtime/speculative_sampler.h"

#include <algorithm>

#include "base/check.h"

namespace peerserve {
namespace {

// Streams of sampling_uniform besides stream 0 (ordinary sampling).
constexpr uint32_t kDraftStream = 1;
constexpr uint32_t kAcceptStream = 2;
constexpr uint32_t kResidualStream = 3;

double probability_of(const TokenDistribution& d, TokenId token) {
  auto it = std::lower_bound(d.tokens.begin(), d.tokens.end(), token);
  if (it == d.tokens.end() || *it != token) return 0.0;
  return d.probs[static_cast<size_t>(it - d.tokens.begin())];
}

// Inverse-CDF draw over weights in ascending token order (the weights need not sum to 1).
TokenId draw(std::span<const TokenId> tokens, std::span<const double> weights, double u) {
  double total = 0.0;
  for (double w : weights) total += w;
  const double target = u * total;
  double cumulative = 0.0;
  TokenId chosen = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    chosen = tokens[i];
    cumulative += weights[i];
    if (cumulative > target) break;
  }
  return chosen;
}

}  // namespace

DraftToken propose_draft(std::span<const float> draft_logits, const SamplingParams& params,
                         const SamplingContext& context) {
  DraftToken draft;
  if (is_greedy(params)) {
    SamplingParams plain = params;
    plain.want_logprobs = false;
    plain.top_logprobs = 0;
    draft.token = sample_token(draft_logits, plain, context).token;
    return draft;
  }
  draft.q = final_distribution(draft_logits, params, context.generated, context.prompt);
  const double u = sampling_uniform(context.seed, context.generated.size(), kDraftStream);
  draft.token = draw(draft.q.tokens, draft.q.probs, u);
  PS_CHECK(draft.token >= 0) << "empty draft distribution";
  return draft;
}

DraftVerdict verify_draft(std::span<const float> target_logits, const SamplingParams& params,
                          const SamplingContext& context, const DraftToken& draft) {
  DraftVerdict verdict;
  if (is_greedy(params)) {
    verdict.token = sample_token(target_logits, params, context);
    verdict.accepted = verdict.token.token == draft.token;
    return verdict;
  }
  const TokenDistribution p =
      final_distribution(target_logits, params, context.generated, context.prompt);
  const double p_x = probability_of(p, draft.token);
  const double q_x = probability_of(draft.q, draft.token);
  const uint64_t position = context.generated.size();
  const double u = sampling_uniform(context.seed, position, kAcceptStream);
  TokenId token = -1;
  // Accept with probability min(1, p(x) / q(x)); q(x) > 0 since x was drawn from q.
  if (q_x > 0.0 && u * q_x < p_x) {
    verdict.accepted = true;
    token = draft.token;
  } else {
    // Residual max(0, p - q) over p's support (outside it, p - q <= 0).
    std::vector<double> residual(p.tokens.size());
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      residual[i] = std::max(0.0, p.probs[i] - probability_of(draft.q, p.tokens[i]));
    }
    const double v = sampling_uniform(context.seed, position, kResidualStream);
    token = draw(p.tokens, residual, v);
    // p == q up to rounding leaves no residual mass: then p itself is the right distribution.
    if (token < 0) token = draw(p.tokens, p.probs, v);
  }
  PS_CHECK(token >= 0) << "empty target distribution";
  verdict.token = describe_token(target_logits, params, token);
  return verdict;
}

}  // namespace peerserve
