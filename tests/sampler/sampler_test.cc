// The sampler against plain references written here: argmax loops, a full-sort top-k /
// top-p / min-p, OpenAI's penalty formula, and softmax(logits / T) for the empirical
// distribution (chi-square with fixed seeds, so the test is deterministic).
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace peerserve {
namespace {

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& v : logits) v = normal(rng);
  return logits;
}

// ---- plain references ----

TokenId reference_argmax(const std::vector<float>& v) {
  TokenId best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[static_cast<size_t>(best)]) best = static_cast<TokenId>(i);
  }
  return best;
}

// OpenAI: logit -= frequency * count + presence * (count > 0); transformers' repetition
// penalty first.
std::vector<float> reference_penalties(std::vector<float> logits, const SamplingParams& p,
                                       const std::vector<TokenId>& generated) {
  std::map<TokenId, int> counts;
  for (TokenId id : generated) counts[id]++;
  for (auto [id, c] : counts) {
    float& x = logits[static_cast<size_t>(id)];
    if (p.repetition_penalty != 1.0f)
      x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    x = x - p.frequency_penalty * static_cast<float>(c) - p.presence_penalty;
  }
  return logits;
}

// softmax(logits / T), then top-k (ties with the k-th kept), top-p (full sort, most likely
// first, ties by id; keep while the mass before the token is below top_p), min-p; renormalised.
std::map<TokenId, double> reference_distribution(const std::vector<float>& raw,
                                                 const SamplingParams& p,
                                                 const std::vector<TokenId>& generated) {
  std::vector<float> logits = reference_penalties(raw, p, generated);
  const size_t n = logits.size();
  std::vector<float> scaled(n);
  const float inv_t = 1.0f / p.temperature;
  for (size_t i = 0; i < n; ++i) scaled[i] = logits[i] * inv_t;
  const float max_value = *std::max_element(scaled.begin(), scaled.end());
  std::vector<double> prob(n);
  for (size_t i = 0; i < n; ++i) prob[i] = std::exp(static_cast<double>(scaled[i]) - max_value);
  std::vector<bool> keep(n, true);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::vector<float> sorted = scaled;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const float kth = sorted[static_cast<size_t>(p.top_k) - 1];
    for (size_t i = 0; i < n; ++i) keep[i] = keep[i] && scaled[i] >= kth;
  }
  // vLLM's order: min_p, then top_p over what is left.
  if (p.min_p > 0.0f) {
    double best = 0;
    for (size_t i = 0; i < n; ++i) {
      if (keep[i]) best = std::max(best, prob[i]);
    }
    for (size_t i = 0; i < n; ++i) keep[i] = keep[i] && prob[i] >= p.min_p * best;
  }
  if (p.top_p < 1.0f) {
    std::vector<size_t> order;
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (keep[i]) {
        order.push_back(i);
        total += prob[i];
      }
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return scaled[a] != scaled[b] ? scaled[a] > scaled[b] : a < b;
    });
    double before = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      if (r > 0 && before >= p.top_p * total) keep[order[r]] = false;
      before += prob[order[r]];
    }
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += keep[i] ? prob[i] : 0.0;
  std::map<TokenId, double> out;
  for (size_t i = 0; i < n; ++i) {
    if (keep[i]) out[static_cast<TokenId>(i)] = prob[i] / total;
  }
  return out;
}

// ---- tests ----

TEST(SamplerTest, GreedyIsArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const auto logits = random_logits(1000 + seed, seed);
    EXPECT_EQ(sample_token(logits, params, {}).token, reference_argmax(logits));
  }
  // Ties go to the lowest id.
  const std::vector<float> tied = {1.0f, 5.0f, 2.0f, 5.0f};
  EXPECT_EQ(sample_token(tied, params, {}).token, 1);
}

// A temperature so small that 1 / temperature overflows is greedy (it picked the last token
// with a positive logit, with a NaN logprob).
TEST(SamplerTest, TinyTemperaturesAreGreedy) {
  const std::vector<float> logits = {1.0f, 5.0f, 2.0f, 0.0f, 3.0f, -1.0f};
  for (float temperature : {1e-39f, 1e-30f, 5e-6f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.want_logprobs = true;
    params.top_logprobs = 2;
    ASSERT_TRUE(params.validate().ok());
    const SampledToken t = sample_token(logits, params, {.seed = 7});
    EXPECT_EQ(t.token, 1) << temperature;
    EXPECT_TRUE(std::isfinite(t.logprob)) << temperature;
  }
}

TEST(SamplerTest, GreedyWithPenaltiesIsArgmaxOfPenalisedLogits) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 1.5f;
  params.presence_penalty = 0.5f;
  params.repetition_penalty = 1.3f;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(500, seed);
    std::vector<TokenId> generated;
    // Generate the current top tokens a few times so that penalties change the winner.
    std::vector<TokenId> order(500);
    for (TokenId i = 0; i < 500; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(),
              [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
    for (int r = 0; r < 5; ++r) {
      for (int k = 0; k <= r; ++k) generated.push_back(order[static_cast<size_t>(r)]);
    }
    const auto expected = reference_argmax(reference_penalties(logits, params, generated));
    EXPECT_EQ(sample_token(logits, params, {.generated = generated, .seed = 1}).token, expected);
  }
}

TEST(SamplerTest, PenaltiesFollowOpenAiFormula) {
  SamplingParams params;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 1.0f;
  std::vector<float> logits = {1.0f, 2.0f, -3.0f, 4.0f};
  const std::vector<TokenId> generated = {1, 1, 1, 2};
  apply_penalties(logits, params, generated);
  // token 1: 2 - 0.5*3 - 1 = -0.5; token 2: -3 - 0.5 - 1 = -4.5; others unchanged.
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], -0.5f);
  EXPECT_FLOAT_EQ(logits[2], -4.5f);
  EXPECT_FLOAT_EQ(logits[3], 4.0f);

  SamplingParams repetition;
  repetition.repetition_penalty = 2.0f;
  std::vector<float> more = {1.0f, 2.0f, -3.0f, 4.0f};
  apply_penalties(more, repetition, generated);
  EXPECT_FLOAT_EQ(more[1], 1.0f);   // positive: divided
  EXPECT_FLOAT_EQ(more[2], -6.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(more[3], 4.0f);

  // Negative penalties encourage repetition (OpenAI allows [-2, 2]).
  SamplingParams encourage;
  encourage.presence_penalty = -2.0f;
  std::vector<float> again = {0.0f, 0.0f};
  const std::vector<TokenId> once = {1};
  apply_penalties(again, encourage, once);
  EXPECT_FLOAT_EQ(again[1], 2.0f);
}

// repetition_penalty counts the prompt's tokens too, each token once (vLLM, transformers);
// frequency and presence count only the generated ones (OpenAI). Values by hand.
TEST(SamplerTest, RepetitionPenaltyCountsThePrompt) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 1.0f;
  std::vector<float> logits = {1.0f, 2.0f, -3.0f, 4.0f, 0.5f};
  const std::vector<TokenId> prompt = {0, 3, 3, 2};
  const std::vector<TokenId> generated = {3};
  apply_penalties(logits, params, generated, prompt);
  EXPECT_FLOAT_EQ(logits[0], 0.5f);          // prompt: 1 / 2
  EXPECT_FLOAT_EQ(logits[1], 2.0f);          // never seen
  EXPECT_FLOAT_EQ(logits[2], -6.0f);         // prompt, negative: -3 * 2
  EXPECT_FLOAT_EQ(logits[3], 4.0f / 2 - 1);  // once for repetition, presence for the output
  EXPECT_FLOAT_EQ(logits[4], 0.5f);
  // A greedy choice moves off a prompt token: 5 / 2 < 4.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.repetition_penalty = 2.0f;
  const std::vector<float> row = {1.0f, 5.0f, 4.0f};
  const std::vector<TokenId> seen = {1};
  EXPECT_EQ(sample_token(row, greedy, {.prompt = seen}).token, 2);
  EXPECT_EQ(sample_token(row, greedy, {}).token, 1);
}

TEST(SamplerTest, SeededRequestsReproduce) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  const auto logits = random_logits(2000, 3, 2.0f);
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xFFFFFFFFFFFFull}) {
    std::vector<TokenId> first;
    std::vector<TokenId> second;
    for (int step = 0; step < 30; ++step) {
      first.push_back(sample_token(logits, params, {.generated = first, .seed = seed}).token);
    }
    // Recomputed independently (as another batch slot would): same tokens.
    for (int step = 0; step < 30; ++step) {
      second.push_back(sample_token(logits, params, {.generated = second, .seed = seed}).token);
    }
    EXPECT_EQ(first, second);
  }
  // Different seeds give different streams.
  std::set<std::vector<TokenId>> streams;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    std::vector<TokenId> tokens;
    for (int step = 0; step < 10; ++step) {
      tokens.push_back(sample_token(logits, params, {.generated = tokens, .seed = seed}).token);
    }
    streams.insert(tokens);
  }
  EXPECT_EQ(streams.size(), 10u);
}

TEST(SamplerTest, TruncationKeepsExactlyTheReferenceTokens) {
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  const std::vector<Setting> settings = {
      {1.0f, 0, 1.0f, 0.0f},   {0.7f, 10, 1.0f, 0.0f},   {1.0f, 0, 0.9f, 0.0f},
      {1.3f, 0, 0.5f, 0.0f},   {1.0f, 0, 1.0f, 0.05f},   {0.8f, 50, 0.8f, 0.0f},
      {1.0f, 20, 0.95f, 0.1f}, {2.0f, 0, 0.99f, 0.01f},  {1.0f, 1, 1.0f, 0.0f},
      {1.0f, 0, 0.001f, 0.0f}, {0.5f, 5000, 0.7f, 0.2f},
  };
  for (size_t s = 0; s < settings.size(); ++s) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      SamplingParams params;
      params.temperature = settings[s].temperature;
      params.top_k = settings[s].top_k;
      params.top_p = settings[s].top_p;
      params.min_p = settings[s].min_p;
      params.frequency_penalty = seed % 2 ? 0.3f : 0.0f;
      ASSERT_TRUE(params.validate().ok());
      // Small vocab, and one as large as DeepSeek-V3's (top-p grows its partial sort).
      const size_t n = seed == 4 ? 129280 : 3000;
      const auto logits =
          random_logits(n, seed * 31 + static_cast<uint32_t>(s), seed == 4 ? 1.0f : 3.0f);
      const std::vector<TokenId> generated = {1, 2, 2, 7};
      const auto expected = reference_distribution(logits, params, generated);
      const TokenDistribution got = final_distribution(logits, params, generated);
      ASSERT_EQ(got.tokens.size(), expected.size()) << "setting " << s << " seed " << seed;
      for (size_t i = 0; i < got.tokens.size(); ++i) {
        ASSERT_TRUE(expected.count(got.tokens[i])) << "token " << got.tokens[i] << " setting " << s;
        // The sampler exponentiates in fp32 (~1e-7 relative), the reference in double.
        EXPECT_NEAR(got.probs[i], expected.at(got.tokens[i]),
                    1e-12 + 1e-6 * expected.at(got.tokens[i]));
      }
    }
  }
}

TEST(SamplerTest, TopKKeepsTies) {
  SamplingParams params;
  params.top_k = 2;
  const std::vector<float> logits = {3.0f, 1.0f, 3.0f, 3.0f, 0.0f};
  const TokenDistribution d = final_distribution(logits, params, {});
  EXPECT_EQ(d.tokens, (std::vector<TokenId>{0, 2, 3}));
}

// Pearson's chi-square of `draws` seeded draws (seeds seed0, seed0 + 1, ...) against the
// reference distribution, and its number of cells; a truncated token drawn fails the test.
struct ChiSquare {
  double value = 0.0;
  int cells = 0;
};
ChiSquare chi_square_of_draws(const std::vector<float>& logits, const SamplingParams& params,
                              int draws, uint64_t seed0) {
  const auto expected = reference_distribution(logits, params, {});
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    counts[static_cast<size_t>(
        sample_token(logits, params, {.seed = seed0 + static_cast<uint64_t>(i)}).token)]++;
  }
  ChiSquare out;
  for (size_t t = 0; t < logits.size(); ++t) {
    const auto it = expected.find(static_cast<TokenId>(t));
    if (it == expected.end()) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " was truncated but drawn";
      continue;
    }
    const double e = it->second * draws;
    out.value += (counts[t] - e) * (counts[t] - e) / e;
    ++out.cells;
  }
  return out;
}

// The empirical distribution of many seeded draws matches softmax(logits / T): Pearson's
// chi-square against the reference probabilities, with fixed seeds (deterministic).
TEST(SamplerTest, SamplesFollowSoftmaxOfTemperatureScaledLogits) {
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  for (const Setting setting :
       {Setting{1.0f, 0, 1.0f}, Setting{0.6f, 0, 1.0f}, Setting{1.7f, 0, 1.0f},
        Setting{1.0f, 8, 1.0f}, Setting{1.0f, 0, 0.8f}}) {
    SamplingParams params;
    params.temperature = setting.temperature;
    params.top_k = setting.top_k;
    params.top_p = setting.top_p;
    const std::vector<float> logits = {2.0f, 1.5f,  1.0f, 0.5f, 0.0f,  -0.5f, -1.0f, 0.3f,
                                       1.2f, -2.0f, 0.8f, 1.7f, -0.2f, 0.1f,  0.9f,  -1.5f};
    const ChiSquare chi = chi_square_of_draws(logits, params, 200000, 0);
    // cells-1 <= 15 degrees of freedom: the 99.999th percentile is about 45; a broken
    // sampler (e.g. ignoring the temperature) gives thousands.
    EXPECT_LT(chi.value, 50.0) << "T=" << setting.temperature << " top_k=" << setting.top_k
                               << " top_p=" << setting.top_p << " cells=" << chi.cells;
  }
}

// The draw over a vocabulary of several of the sampler's 256-token blocks (its walk goes
// block, then token) and not a multiple of them, plain and with top-p: chi-square against
// the reference distribution. Logits of scale 0.5 keep every cell's expectation near 36.
TEST(SamplerTest, DrawsOverALargeVocabularyFollowTheDistribution) {
  const std::vector<float> logits = random_logits(1100, 17, 0.5f);
  for (const float top_p : {1.0f, 0.7f}) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.top_p = top_p;
    const ChiSquare chi = chi_square_of_draws(logits, params, 40000, 77);
    // cells - 1 degrees of freedom (1,099 plain, fewer with top-p): mean cells - 1, standard
    // deviation sqrt(2 (cells - 1)); the bound is 6 standard deviations above the mean. A draw
    // that forgets the mass of the blocks before its own gives tens of thousands.
    const double dof = chi.cells - 1;
    EXPECT_LT(chi.value, dof + 6.0 * std::sqrt(2.0 * dof))
        << "top_p " << top_p << ", " << chi.cells << " cells";
  }
}

// +inf logits (or ones that overflow when scaled): drawn alone, alike, never an abort.
TEST(SamplerTest, InfiniteLogitsAreTheOnlyChoice) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float top_p : {1.0f, 0.9f}) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.top_p = top_p;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      EXPECT_EQ(sample_token(std::vector<float>{0.0f, inf, 0.0f}, params, {.seed = seed}).token, 1);
      const TokenId two =
          sample_token(std::vector<float>{inf, 1.0f, inf}, params, {.seed = seed}).token;
      EXPECT_TRUE(two == 0 || two == 2) << two;
    }
    const TokenDistribution d =
        final_distribution(std::vector<float>{0.0f, inf, 0.0f}, params, {}, {});
    ASSERT_EQ(d.tokens.size(), 1u);
    EXPECT_EQ(d.tokens[0], 1);
    EXPECT_DOUBLE_EQ(d.probs[0], 1.0);
    SamplingParams cold = params;
    cold.temperature = 0.01f;  // 3e37 / 0.01 overflows
    const TokenId hot =
        sample_token(std::vector<float>{3e37f, 1.0f, 3e37f}, cold, {.seed = 3}).token;
    EXPECT_TRUE(hot == 0 || hot == 2) << hot;
  }
}

// Logprobs as vLLM reports them by default (raw_logprobs): log_softmax of the model's logits,
// whatever the penalties, temperature and truncation of the request.
TEST(SamplerTest, LogprobsAreTheModelsRawDistribution) {
  const auto logits = random_logits(5000, 11);
  double max_value = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float v : logits) total += std::exp(v - max_value);
  const auto log_softmax = [&](TokenId t) {
    return logits[static_cast<size_t>(t)] - max_value - std::log(total);
  };
  std::vector<TokenId> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
  std::sort(order.begin(), order.end(),
            [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.want_logprobs = true;
  greedy.top_logprobs = 5;
  SamplingParams penalised = greedy;
  penalised.repetition_penalty = 3.0f;  // moves the argmax's logit, not its logprob
  const std::vector<TokenId> prompt = {order[0], order[1]};
  SamplingParams sampled;
  sampled.temperature = 0.3f;
  sampled.top_k = 3;
  sampled.want_logprobs = true;
  sampled.top_logprobs = 10;
  for (const auto& [params, context] : {std::pair{greedy, SamplingContext{}},
                                        std::pair{penalised, SamplingContext{.prompt = prompt}},
                                        std::pair{sampled, SamplingContext{.seed = 5}}}) {
    const SampledToken t = sample_token(logits, params, context);
    // fp32 logits, log-sum-exp in double: ~1e-6 absolute.
    EXPECT_NEAR(t.logprob, log_softmax(t.token), 1e-5);
    ASSERT_EQ(t.top_logprobs.size(), static_cast<size_t>(params.top_logprobs));
    for (size_t r = 0; r < t.top_logprobs.size(); ++r) {
      EXPECT_EQ(t.top_logprobs[r].token, order[r]);
      EXPECT_NEAR(t.top_logprobs[r].logprob, log_softmax(order[r]), 1e-5);
    }
    // describe_token (speculative decoding's) reports the same.
    const SampledToken d = describe_token(logits, params, t.token);
    EXPECT_EQ(d.logprob, t.logprob);
    ASSERT_EQ(d.top_logprobs.size(), t.top_logprobs.size());
  }
  // The penalty changed the choice; the reported logprob is still the model's.
  EXPECT_NE(sample_token(logits, penalised, {.prompt = prompt}).token, order[0]);
}

// top_logprobs lists the most likely tokens, equal logits by id, whatever their place in the
// vocabulary; a NaN logit is never listed and has probability 0 (the others' logprobs stay
// finite).
TEST(SamplerTest, TopLogprobsBreakTiesById) {
  std::vector<float> logits = random_logits(3000, 23, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const size_t id : {2999u, 5u, 1700u, 42u}) logits[id] = 9.0f;  // four equal maxima
  logits[100] = 8.0f;
  logits[7] = nan;
  SamplingParams params;
  params.temperature = 0.0f;
  params.want_logprobs = true;
  params.top_logprobs = 6;
  const SampledToken t = sample_token(logits, params, {});
  EXPECT_EQ(t.token, 5);
  std::vector<TokenId> ids;
  for (const TokenLogprob& e : t.top_logprobs) ids.push_back(e.token);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + 5),
            (std::vector<TokenId>{5, 42, 1700, 2999, 100}));
  EXPECT_NE(ids[5], 7);
  EXPECT_TRUE(std::isfinite(t.logprob));
  EXPECT_FLOAT_EQ(t.top_logprobs[0].logprob, t.top_logprobs[3].logprob);
}

// Logprobs at softmax's limits: +inf logits share the mass (log 1, log 1/2), the others and
// a NaN logit have none, and a row with nothing finite reports -inf (the API sends -9999).
TEST(SamplerTest, LogprobsOfInfiniteAndNaNLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SamplingParams params;
  params.temperature = 0.0f;
  params.want_logprobs = true;
  params.top_logprobs = 2;
  SampledToken t = sample_token(std::vector<float>{1.0f, inf, 2.0f}, params, {});
  EXPECT_EQ(t.token, 1);
  EXPECT_EQ(t.logprob, 0.0f);
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);
  EXPECT_EQ(t.top_logprobs[0].logprob, 0.0f);
  EXPECT_EQ(t.top_logprobs[1].logprob, -inf);
  t = sample_token(std::vector<float>{inf, 0.0f, inf}, params, {});
  EXPECT_FLOAT_EQ(t.logprob, -std::log(2.0f));
  t = sample_token(std::vector<float>{-inf, -inf, nan}, params, {});
  EXPECT_EQ(t.logprob, -inf);
  // A NaN logit's own logprob when it is forced (describe_token: a verified draft's).
  const SampledToken forced = describe_token(std::vector<float>{0.5f, nan, 1.0f}, params, 1);
  EXPECT_EQ(forced.logprob, -inf);
  EXPECT_TRUE(std::isfinite(forced.top_logprobs[0].logprob));
}

// logit_bias is added before the penalties and temperature (vLLM's order): it moves the
// argmax and the sampled distribution, not the reported (raw) logprobs; values past +-100
// are refused by validate().
TEST(SamplerTest, LogitBiasMovesTheChoice) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.logit_bias = {{2, 2.5f}, {0, -0.1f}};
  EXPECT_EQ(sample_token(logits, params, {}).token, 2);  // 0 + 2.5 beats 2 - 0.1
  params.temperature = 1.0f;
  const TokenDistribution d = final_distribution(logits, params, {});
  ASSERT_EQ(d.tokens.size(), 4u);
  const double total = std::exp(1.9) + std::exp(1.0) + std::exp(2.5) + std::exp(-1.0);
  EXPECT_NEAR(d.probs[2], std::exp(2.5) / total, 1e-6);
  params.logit_bias = {{1, 101.0f}};
  EXPECT_NE(params.validate().message().find("logit_bias"), std::string::npos);
}

// min_p before top_p (vLLM): min_p 0.2 keeps A, B, C (probabilities .30, .09, .07 against a
// tail of 55 tokens at .01); top_p 0.7 of those renormalised (.65, .20, .15) keeps A and B.
// top_p first would keep A, B, C and 24 tail tokens, then min_p A, B, C.
TEST(SamplerTest, MinPComesBeforeTopP) {
  std::vector<float> logits = {std::log(0.30f), std::log(0.09f), std::log(0.07f)};
  for (int i = 0; i < 54; ++i) logits.push_back(std::log(0.01f));
  SamplingParams params;
  params.min_p = 0.2f;
  params.top_p = 0.7f;
  const TokenDistribution d = final_distribution(logits, params, {});
  EXPECT_EQ(d.tokens, (std::vector<TokenId>{0, 1}));
}

TEST(SamplerTest, ValidateNamesTheField) {
  const auto message = [](SamplingParams p) { return p.validate().message(); };
  SamplingParams p;
  EXPECT_TRUE(p.validate().ok());
  p.temperature = -1.0f;
  EXPECT_NE(message(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0.0f;
  EXPECT_NE(message(p).find("top_p"), std::string::npos);
  p = {};
  p.top_k = -5;
  EXPECT_NE(message(p).find("top_k"), std::string::npos);
  p = {};
  p.min_p = 1.5f;
  EXPECT_NE(message(p).find("min_p"), std::string::npos);
  p = {};
  p.presence_penalty = 3.0f;
  EXPECT_NE(message(p).find("presence_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = -2.5f;
  EXPECT_NE(message(p).find("frequency_penalty"), std::string::npos);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(message(p).find("repetition_penalty"), std::string::npos);
  p = {};
  p.top_logprobs = 21;
  p.want_logprobs = true;
  EXPECT_NE(message(p).find("top_logprobs"), std::string::npos);
  p = {};
  p.top_logprobs = 3;
  EXPECT_NE(message(p).find("logprobs"), std::string::npos);
  p = {};
  p.temperature = std::nanf("");
  EXPECT_FALSE(p.validate().ok());
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// vLLM's min_tokens: the suppressed tokens (EOS, stop ids) cannot be drawn before
// min_tokens tokens exist, greedy or sampled, and the distribution is renormalised
// without them; from then on they are ordinary tokens again.
TEST(SamplerTest, MinTokensSuppressesEndingTokens) {
  std::vector<float> logits = {0.0f, 9.0f, 1.0f, 8.5f, 2.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.min_tokens = 3;
  params.suppressed_until_min_tokens = {1, 3, 99};  // 99: outside the vocabulary, ignored
  const std::vector<TokenId> two = {4, 4};
  const std::vector<TokenId> three = {4, 4, 4};
  EXPECT_EQ(sample_token(logits, params, {.generated = two}).token, 4);
  EXPECT_EQ(sample_token(logits, params, {.generated = three}).token, 1);
  EXPECT_EQ(sample_token(logits, params, {}).token, 4);

  params.temperature = 1.0f;
  params.want_logprobs = true;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const SampledToken t = sample_token(logits, params, {.generated = two, .seed = seed});
    EXPECT_NE(t.token, 1);
    EXPECT_NE(t.token, 3);
    for (const TokenLogprob& alt : t.top_logprobs) EXPECT_TRUE(alt.token != 1 && alt.token != 3);
  }
  // The remaining three tokens renormalised: p(4) = e^2 / (1 + e + e^2).
  const TokenDistribution d = final_distribution(logits, params, two);
  ASSERT_EQ(d.tokens, (std::vector<TokenId>{0, 2, 4}));
  const double total = 1.0 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(d.probs[2], std::exp(2.0) / total, 1e-6);
  const TokenDistribution after = final_distribution(logits, params, three);
  EXPECT_EQ(after.tokens.size(), 5u);

  params.min_tokens = -1;
  EXPECT_NE(params.validate().message().find("min_tokens"), std::string::npos);
}

// The forced-output testing hook: at position t the forced token is the only one left,
// greedy or sampled, whatever the logits; after the list, sampling is as usual.
TEST(SamplerTest, ForcedTokensAreTheOnlyChoice) {
  const std::vector<float> logits = {0.0f, 9.0f, -3.0f, 8.5f, 2.0f};
  SamplingParams params;
  params.forced_tokens = {2, 0};
  params.repetition_penalty = 1.3f;
  params.want_logprobs = true;
  for (float temperature : {0.0f, 0.7f, 1.0f}) {
    params.temperature = temperature;
    for (uint64_t seed = 0; seed < 50; ++seed) {
      const SampledToken first = sample_token(logits, params, {.seed = seed});
      EXPECT_EQ(first.token, 2);
      // The model's logprob of the forced token (raw logprobs), not the forced 0.
      double total = 0.0;
      for (float v : logits) total += std::exp(static_cast<double>(v) - 9.0);
      EXPECT_NEAR(first.logprob, -3.0 - 9.0 - std::log(total), 1e-5);
      const std::vector<TokenId> one = {2};
      EXPECT_EQ(sample_token(logits, params, {.generated = one, .seed = seed}).token, 0);
    }
  }
  params.temperature = 0.0f;
  const std::vector<TokenId> two = {2, 0};
  EXPECT_EQ(sample_token(logits, params, {.generated = two}).token, 1);  // the argmax again
  const TokenDistribution d = final_distribution(logits, params, {});
  EXPECT_EQ(d.tokens, (std::vector<TokenId>{2}));
}

// A prompt token's logprob (vLLM's prompt_logprobs) against a plain log-softmax in double, its
// rank against a count of the larger logits, and its top entries against a sort.
TEST(SamplerTest, PromptTokenLogprobMatchesAPlainReference) {
  for (const uint32_t seed : {3u, 17u, 99u}) {
    const std::vector<float> logits = random_logits(5000, seed, 4.0f);
    double max_value = logits[0];
    for (float v : logits) max_value = std::max<double>(max_value, v);
    double total = 0.0;
    for (float v : logits) total += std::exp(v - max_value);
    std::vector<TokenId> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
    for (const TokenId token : {order[0], order[7], order[4999], TokenId{1234}}) {
      const PromptTokenLogprob d = describe_prompt_token(logits, token, 4);
      EXPECT_EQ(d.token, token);
      // fp32 logits, log-sum-exp in double: ~1e-6 absolute.
      EXPECT_NEAR(d.logprob, logits[token] - max_value - std::log(total), 1e-5);
      int32_t larger = 0;
      for (float v : logits) larger += v > logits[token];
      EXPECT_EQ(d.rank, larger + 1);
      ASSERT_EQ(d.top_logprobs.size(), 4u);
      for (size_t r = 0; r < 4; ++r) EXPECT_EQ(d.top_logprobs[r].token, order[r]);
    }
    EXPECT_EQ(describe_prompt_token(logits, order[0], 0).rank, 1);
    EXPECT_TRUE(describe_prompt_token(logits, order[0], 0).top_logprobs.empty());
  }
}

// allowed_token_ids (vLLM's): greedy takes the most likely allowed token, a draw keeps to the
// set with the set's renormalised probabilities, and logprobs stay the model's.
TEST(SamplerTest, AllowedTokenIdsRestrictTheDraw) {
  const std::vector<float> logits = random_logits(1000, 61, 2.0f);
  const std::vector<TokenId> allowed = {5, 250, 251, 999};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.allowed_token_ids = allowed;
  greedy.want_logprobs = true;
  TokenId best = allowed[0];
  for (const TokenId t : allowed) best = logits[t] > logits[best] ? t : best;
  const SampledToken g = sample_token(logits, greedy, {});
  EXPECT_EQ(g.token, best);
  EXPECT_EQ(g.logprob, describe_token(logits, greedy, best).logprob);  // the model's logprob
  EXPECT_EQ(g.top_logprobs.size(), 0u);

  SamplingParams drawn;
  drawn.temperature = 1.0f;
  drawn.allowed_token_ids = allowed;
  const TokenDistribution d = final_distribution(logits, drawn, {});
  EXPECT_EQ(d.tokens, allowed);
  double z = 0.0;
  for (const TokenId t : allowed) z += std::exp(static_cast<double>(logits[t]));
  for (size_t i = 0; i < allowed.size(); ++i) {
    EXPECT_NEAR(d.probs[i], std::exp(static_cast<double>(logits[allowed[i]])) / z, 1e-6);
  }
  std::map<TokenId, int> counts;
  for (uint64_t seed = 0; seed < 2000; ++seed)
    ++counts[sample_token(logits, drawn, {.seed = seed}).token];
  for (const auto& [token, count] : counts) {
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), token), allowed.end()) << token;
  }
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// A structured-output constraint over a 1000-token vocabulary whose token i spells "a" for
// even i below 100, "b" for odd i below 100, and "c" otherwise; EOS is 999 (no text).
std::shared_ptr<const grammar::TokenConstraint> ab_constraint(const std::string& pattern) {
  static const std::string kA = "a", kB = "b", kC = "c";
  auto vocabulary =
      grammar::TokenVocabulary::build(1000,
                                      [](TokenId id) -> std::optional<std::string_view> {
                                        if (id == 999) return std::nullopt;
                                        return id >= 100 ? kC : id % 2 == 0 ? kA : kB;
                                      },
                                      {999});
  auto automaton = grammar::RegexAutomaton::compile(pattern);
  PS_CHECK(automaton.ok()) << automaton.status().message();
  return std::make_shared<const grammar::TokenConstraint>(*automaton, vocabulary);
}

TEST(SamplerTest, ConstraintRestrictsTheDrawToItsLanguage) {
  const std::vector<float> logits = random_logits(1000, 67, 2.0f);
  SamplingParams drawn;
  drawn.temperature = 0.8f;
  drawn.top_k = 40;
  drawn.constraint = ab_constraint("ab*");
  // At the start only "a" tokens; after "a" the "b" tokens and EOS (a whole match).
  const std::vector<TokenId> none, after_a = {2};
  for (const auto* generated : {&none, &after_a}) {
    const TokenDistribution d = final_distribution(logits, drawn, *generated);
    // The plain reference: softmax(logits / T) over the allowed tokens, then top-k of those.
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < 1000; ++t) {
      const bool a = t < 100 && t % 2 == 0, b = t < 100 && t % 2 == 1;
      if (generated->empty() ? a : (b || t == 999)) allowed.push_back(t);
    }
    std::sort(allowed.begin(), allowed.end(), [&](TokenId x, TokenId y) {
      return logits[x] != logits[y] ? logits[x] > logits[y] : x < y;
    });
    allowed.resize(std::min<size_t>(allowed.size(), 40));
    double z = 0.0;
    for (const TokenId t : allowed) z += std::exp(static_cast<double>(logits[t]) / 0.8);
    std::sort(allowed.begin(), allowed.end());
    ASSERT_EQ(d.tokens, allowed);
    for (size_t i = 0; i < allowed.size(); ++i) {
      EXPECT_NEAR(d.probs[i], std::exp(static_cast<double>(logits[allowed[i]]) / 0.8) / z, 1e-6);
    }
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.want_logprobs = true;
  greedy.constraint = drawn.constraint;
  TokenId best = 0;
  for (TokenId t = 0; t < 100; t += 2) best = logits[t] > logits[best] ? t : best;
  const SampledToken g = sample_token(logits, greedy, {});
  EXPECT_EQ(g.token, best);
  // The logprob stays the model's (vLLM's raw logprobs), not the masked distribution's.
  SamplingParams plain;
  plain.want_logprobs = true;
  EXPECT_EQ(g.logprob, describe_token(logits, plain, best).logprob);
}

TEST(SamplerTest, ConstraintWinsWhenOtherRestrictionsLeaveNothing) {
  std::vector<float> logits(1000, 0.0f);
  logits[999] = 5.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  p.constraint = ab_constraint("a");
  // After "a" only EOS is allowed, and min_tokens forbids EOS: EOS is drawn anyway rather
  // than a token outside the language (or a crash on an empty distribution).
  p.min_tokens = 5;
  p.suppressed_until_min_tokens = {999};
  const std::vector<TokenId> after_a = {0};
  EXPECT_EQ(sample_token(logits, p, {.generated = after_a}).token, 999);
  p.temperature = 1.0f;
  EXPECT_EQ(sample_token(logits, p, {.generated = after_a, .seed = 3}).token, 999);
  // allowed_token_ids disjoint from the language: the language's tokens, as equals.
  p.min_tokens = 0;
  p.allowed_token_ids = {500};
  const TokenDistribution d = final_distribution(logits, p, {});
  ASSERT_EQ(d.tokens.size(), 50u);  // the 50 "a" tokens
  for (const double prob : d.probs) EXPECT_NEAR(prob, 1.0 / 50, 1e-9);
}

// vLLM's bad_words: a one-token word is never drawn; a longer word's last token only after
// the rest of it (the generated tokens, not the prompt).
TEST(SamplerTest, BadWordsBanTheLastTokenAfterTheRest) {
  std::vector<float> logits(100, 0.0f);
  logits[7] = 9.0f;  // the argmax: banned as a one-token word
  logits[8] = 8.0f;  // banned only after 3, 4
  logits[9] = 7.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  p.bad_words_ids = {{7}, {3, 4, 8}};
  const std::vector<TokenId> none, after_34 = {1, 3, 4}, after_4 = {1, 4}, prompt_34 = {3, 4};
  EXPECT_EQ(sample_token(logits, p, {.generated = none}).token, 8);
  EXPECT_EQ(sample_token(logits, p, {.generated = after_34}).token, 9);
  EXPECT_EQ(sample_token(logits, p, {.generated = after_4}).token, 8);
  EXPECT_EQ(sample_token(logits, p, {.generated = none, .prompt = prompt_34}).token, 8);
  // Sampled: the banned tokens get probability 0, the rest keep softmax's proportions.
  p.temperature = 1.0f;
  const TokenDistribution d = final_distribution(logits, p, after_34);
  EXPECT_EQ(std::count(d.tokens.begin(), d.tokens.end(), 7), 0);
  EXPECT_EQ(std::count(d.tokens.begin(), d.tokens.end(), 8), 0);
  ASSERT_EQ(d.tokens.size(), 98u);
  double z = 0.0;
  for (int t = 0; t < 100; ++t)
    z += t == 7 || t == 8 ? 0.0 : std::exp(static_cast<double>(logits[t]));
  EXPECT_NEAR(d.probs[std::find(d.tokens.begin(), d.tokens.end(), 9) - d.tokens.begin()],
              std::exp(7.0) / z, 1e-6);
}

}  // namespace
}  // namespace peerserve
