// Speculative sampling against plain references: the emitted token is ordinary sampling's
// (so its empirical distribution equals the target distribution: Pearson's chi-square against
// softmax(logits / T) truncated by top-k / top-p, computed here with a full sort), the
// acceptance rate equals the race coupling's, sum_x 1 / sum_y max(p(y) / p(x), q(y) / q(x)),
// and greedy verification emits the target's argmax.
#include "runtime/speculative_sampler.h"

#include "grammar/regex_automaton.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace peerserve {
namespace {

// softmax(logits / T), top-k (ties with the k-th kept), then top-p (most likely first, ties by
// id; a token is kept while the mass before it is below top_p); renormalised.
std::vector<double> reference_distribution(const std::vector<float>& logits, float temperature,
                                           int32_t top_k, float top_p) {
  const size_t n = logits.size();
  std::vector<double> p(n);
  double max_value = -1e300;
  for (float v : logits) max_value = std::max(max_value, static_cast<double>(v) / temperature);
  for (size_t i = 0; i < n; ++i) p[i] = std::exp(logits[i] / temperature - max_value);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  if (top_k > 0 && static_cast<size_t>(top_k) < n) {
    const double kth = p[order[static_cast<size_t>(top_k) - 1]];
    for (double& v : p) v = v >= kth ? v : 0.0;
  }
  double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= total;
  if (top_p < 1.0f) {
    double before = 0.0;
    for (size_t i : order) {
      if (before >= top_p) {
        before += p[i];
        p[i] = 0.0;
      } else {
        before += p[i];
      }
    }
    total = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& v : p) v /= total;
  }
  return p;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& v : logits) v = normal(rng);
  return logits;
}

struct Setting {
  float temperature;
  int32_t top_k;
  float top_p;
};

TEST(SpeculativeSamplerTest, EmittedTokensFollowTheTargetDistribution) {
  constexpr size_t kVocab = 12;
  constexpr int kDraws = 200000;
  for (const Setting s : {Setting{1.0f, 0, 1.0f}, Setting{0.7f, 0, 1.0f}, Setting{1.3f, 5, 1.0f},
                          Setting{1.0f, 0, 0.8f}, Setting{0.9f, 6, 0.9f}}) {
    // A draft model that is close but not equal to the target, as an MTP head is.
    const std::vector<float> target = random_logits(kVocab, 1, 1.5f);
    std::vector<float> draft = target;
    const std::vector<float> noise = random_logits(kVocab, 2, 1.0f);
    for (size_t i = 0; i < kVocab; ++i) draft[i] += noise[i];

    SamplingParams params;
    params.temperature = s.temperature;
    params.top_k = s.top_k;
    params.top_p = s.top_p;
    const std::vector<double> p = reference_distribution(target, s.temperature, s.top_k, s.top_p);
    const std::vector<double> q = reference_distribution(draft, s.temperature, s.top_k, s.top_p);
    // Both raced with the same exponentials E_y: x wins both when E_y > E_x max(p(y) / p(x),
    // q(y) / q(x)) for every y, which has probability 1 / sum_y max(...). Between rejection
    // sampling's sum_x min(p, q) and (that) / (2 - that).
    double expected_acceptance = 0.0, maximal = 0.0;
    for (size_t x = 0; x < kVocab; ++x) {
      maximal += std::min(p[x], q[x]);
      if (p[x] == 0.0 || q[x] == 0.0) continue;
      double ratio_sum = 0.0;
      for (size_t y = 0; y < kVocab; ++y) ratio_sum += std::max(p[y] / p[x], q[y] / q[x]);
      expected_acceptance += 1.0 / ratio_sum;
    }
    EXPECT_LE(expected_acceptance, maximal + 1e-12);
    EXPECT_GE(expected_acceptance, maximal / (2.0 - maximal) - 1e-12);

    std::vector<int> counts(kVocab, 0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      const SamplingContext context{.generated = {}, .seed = static_cast<uint64_t>(i) * 7919u};
      const DraftToken proposal = propose_draft(draft, params, context);
      const DraftVerdict verdict = verify_draft(target, params, context, proposal);
      ++counts[static_cast<size_t>(verdict.token.token)];
      accepted += verdict.accepted ? 1 : 0;
      ASSERT_EQ(verdict.accepted, verdict.token.token == proposal.token);
      // The token ordinary sampling draws here, whatever the draft: a position emits the
      // same token with or without one.
      ASSERT_EQ(verdict.token.token, sample_token(target, params, context).token);
    }
    double chi_square = 0.0;
    int cells = 0;
    for (size_t t = 0; t < kVocab; ++t) {
      if (p[t] == 0.0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " has target probability 0 but was emitted";
        continue;
      }
      const double e = p[t] * kDraws;
      chi_square += (counts[t] - e) * (counts[t] - e) / e;
      ++cells;
    }
    // <= 11 degrees of freedom: the 99.999th percentile is about 37; emitting the draft's
    // distribution instead (no rejection) gives thousands here.
    EXPECT_LT(chi_square, 40.0) << "T=" << s.temperature << " top_k=" << s.top_k
                                << " top_p=" << s.top_p << " cells=" << cells;
    // Acceptance is Bernoulli(expected_acceptance): 6 standard deviations.
    const double rate = static_cast<double>(accepted) / kDraws;
    const double sd = std::sqrt(expected_acceptance * (1 - expected_acceptance) / kDraws);
    EXPECT_NEAR(rate, expected_acceptance, 6 * sd + 1e-9) << "T=" << s.temperature;
  }
}

TEST(SpeculativeSamplerTest, AnExactDraftIsAlwaysAccepted) {
  const std::vector<float> logits = random_logits(50, 3, 2.0f);
  SamplingParams params;
  params.temperature = 0.8f;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    const SamplingContext context{.generated = {}, .seed = seed};
    const DraftToken proposal = propose_draft(logits, params, context);
    EXPECT_TRUE(verify_draft(logits, params, context, proposal).accepted) << seed;
  }
}

TEST(SpeculativeSamplerTest, GreedyVerificationEmitsTheTargetArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = 1.5f;  // applied to both sides
  const std::vector<TokenId> generated = {4, 4, 9};
  int accepted = 0;
  for (uint32_t trial = 0; trial < 200; ++trial) {
    const std::vector<float> target = random_logits(64, 100 + trial, 2.0f);
    const std::vector<float> draft = random_logits(64, 500 + trial % 7, 2.0f);
    const SamplingContext context{.generated = generated, .seed = trial};
    const DraftToken proposal = propose_draft(trial % 2 ? target : draft, params, context);
    // The reference: argmax of the penalised target logits (lowest id on ties).
    std::vector<float> penalised = target;
    for (TokenId t : {4, 9}) penalised[static_cast<size_t>(t)] -= 1.5f;
    const TokenId expected = static_cast<TokenId>(
        std::max_element(penalised.begin(), penalised.end()) - penalised.begin());
    const DraftVerdict verdict = verify_draft(target, params, context, proposal);
    EXPECT_EQ(verdict.token.token, expected);
    EXPECT_EQ(verdict.accepted, proposal.token == expected);
    accepted += verdict.accepted ? 1 : 0;
  }
  EXPECT_GE(accepted, 100);  // every odd trial drafts from the target itself
}

TEST(SpeculativeSamplerTest, SeededVerificationReproduces) {
  const std::vector<float> target = random_logits(40, 7, 1.0f);
  const std::vector<float> draft = random_logits(40, 8, 1.0f);
  SamplingParams params;
  params.temperature = 1.0f;
  params.want_logprobs = true;
  params.top_logprobs = 3;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const SamplingContext context{.generated = {}, .seed = seed};
    const DraftVerdict a =
        verify_draft(target, params, context, propose_draft(draft, params, context));
    const DraftVerdict b =
        verify_draft(target, params, context, propose_draft(draft, params, context));
    EXPECT_EQ(a.token.token, b.token.token);
    EXPECT_EQ(a.accepted, b.accepted);
    // The logprob is the target's final distribution's, as ordinary sampling reports it.
    const std::vector<double> p = reference_distribution(target, 1.0f, 0, 1.0f);
    EXPECT_NEAR(a.token.logprob, std::log(p[static_cast<size_t>(a.token.token)]), 1e-5);
    EXPECT_EQ(a.token.top_logprobs.size(), 3u);
  }
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// Under a structured-output constraint the emitted token follows the target distribution
// restricted to the allowed tokens (the reference: logits of the others set to -inf, then
// softmax), whatever the draft proposes: drafts outside the language are rejected.
TEST(SpeculativeSamplerTest, ConstrainedEmissionsFollowTheMaskedTarget) {
  constexpr size_t kVocab = 12;
  constexpr int kDraws = 50000;  // each draw walks the constraint: kept short under ASan
  // Tokens 0-5 spell "a", 6-10 spell "b", 11 is EOS; the language is a+b.
  static const std::string kA = "a", kB = "b";
  auto vocabulary =
      grammar::TokenVocabulary::build(static_cast<int32_t>(kVocab),
                                      [](TokenId id) -> std::optional<std::string_view> {
                                        if (id == 11) return std::nullopt;
                                        return id < 6 ? kA : kB;
                                      },
                                      {11});
  auto automaton = grammar::RegexAutomaton::compile("a+b");
  ASSERT_TRUE(automaton.ok());
  SamplingParams params;
  params.temperature = 0.9f;
  params.constraint = std::make_shared<const grammar::TokenConstraint>(*automaton, vocabulary);
  const std::vector<float> target = random_logits(kVocab, 5, 1.5f);
  std::vector<float> draft = target;
  const std::vector<float> noise = random_logits(kVocab, 6, 1.0f);
  for (size_t i = 0; i < kVocab; ++i) draft[i] += noise[i];
  // After "a": the "a" and "b" tokens are allowed, EOS is not (no whole match yet).
  const std::vector<TokenId> generated = {0};
  std::vector<float> masked = target;
  masked[11] = -std::numeric_limits<float>::infinity();
  const std::vector<double> p = reference_distribution(masked, 0.9f, 0, 1.0f);
  std::vector<int> counts(kVocab, 0);
  for (int i = 0; i < kDraws; ++i) {
    const SamplingContext context{.generated = generated, .seed = static_cast<uint64_t>(i) * 31u};
    const DraftToken proposal = propose_draft(draft, params, context);
    ++counts[static_cast<size_t>(verify_draft(target, params, context, proposal).token.token)];
  }
  EXPECT_EQ(counts[11], 0) << "EOS before a whole match";
  double chi_square = 0.0;
  for (size_t t = 0; t < 11; ++t) {
    const double e = p[t] * kDraws;
    chi_square += (counts[t] - e) * (counts[t] - e) / e;
  }
  EXPECT_LT(chi_square, 40.0);  // 10 degrees of freedom: the 99.999th percentile is ~35.6
}

}  // namespace
}  // namespace peerserve
