#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <unordered_map>

#include "base/splitmix64.h"
#include "kernels/race_uniforms.h"
#include "kernels/softmax.h"
#include "kernels/vector_ops.h"

namespace peerserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool has_penalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
         params.frequency_penalty != 0.0f ||
         (params.min_tokens > 0 && !params.suppressed_until_min_tokens.empty()) ||
         !params.forced_tokens.empty() || !params.logit_bias.empty() ||
         !params.allowed_token_ids.empty() || !params.bad_words_ids.empty() ||
         params.constraint != nullptr;
}

// The first largest non-NaN logit (0 if all are NaN), vectorized: the scalar loop took
// ~1.8 us of a 4,096-entry vocabulary per greedy token, 7% of a batch-32 decode step of
// the shipped model.
TokenId argmax(std::span<const float> values) {
  return static_cast<TokenId>(kernels::argmax(values.data(), static_cast<int64_t>(values.size())));
}

// Descending value, then ascending id: the order top-k/top-p and top_logprobs use.
struct ByLikelihood {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] != values[b] ? values[a] > values[b] : a < b;
  }
};

// The truncated distribution in unnormalised form: weight[i] = exp(scaled[i] - max) for
// kept tokens (fp32, as exp is computed), 0 for dropped ones; masses summed in double, per
// block of kBlock tokens in token order, the blocks in order. One per thread, reused: a
// vocabulary-sized allocation per token was an mmap that paid its page faults every time.
constexpr size_t kBlock = 256;
struct Truncation {
  std::vector<float> scaled;       // penalised logits / temperature
  std::vector<float> weight;       // 0 for dropped tokens
  std::vector<double> block_mass;  // sum of weight over each block of kBlock tokens
  double total = 0.0;              // sum of block_mass, in block order
  float max_scaled = kNegInf;
  size_t top = 0;                    // a token of the largest weight (1), always kept
  std::vector<uint32_t> candidates;  // race()'s scratch
  // apply_top_p's scratch.
  std::vector<uint16_t> bucket_of;
  std::vector<double> bucket_mass;
  std::vector<int32_t> crossing;
};

Truncation& thread_truncation() {
  thread_local Truncation t;
  return t;
}

// Fills block_mass and total from weight (top-p's cut and final_distribution read them). Each
// block is summed in token order, four blocks at a time as independent chains.
void sum_blocks(Truncation& t) {
  const size_t n = t.weight.size(), blocks = (n + kBlock - 1) / kBlock;
  const float* w = t.weight.data();
  t.block_mass.assign(blocks, 0.0);
  size_t b = 0;
  for (; (b + 4) * kBlock <= n; b += 4) {
    const float* p = w + b * kBlock;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (size_t j = 0; j < kBlock; ++j) {
      s0 += p[j];
      s1 += p[kBlock + j];
      s2 += p[2 * kBlock + j];
      s3 += p[3 * kBlock + j];
    }
    t.block_mass[b] = s0;
    t.block_mass[b + 1] = s1;
    t.block_mass[b + 2] = s2;
    t.block_mass[b + 3] = s3;
  }
  for (; b < blocks; ++b) {
    double sum = 0.0;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) sum += w[i];
    t.block_mass[b] = sum;
  }
  t.total = 0.0;
  for (double m : t.block_mass) t.total += m;
}

// The k-th largest value (counting repeats). A bounded min-heap for small k touches each
// value once; nth_element for large k.
float kth_largest(const std::vector<float>& values, size_t k) {
  if (k > 1024) {
    std::vector<float> copy(values);
    std::nth_element(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(k - 1), copy.end(),
                     std::greater<>());
    return copy[k - 1];
  }
  std::vector<float> heap;  // min-heap of the k largest so far
  heap.reserve(k);
  for (float v : values) {
    if (heap.size() < k) {
      heap.push_back(v);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    } else if (v > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = v;
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  }
  return heap.front();
}

// top-p: keep tokens, most likely first, while the mass before them is below top_p. Only
// the tokens of the histogram bucket where the cumulative mass crosses top_p are sorted:
// buckets are narrow ranges of max - logit, so every token of an earlier bucket is more
// likely (kept) and every token of a later one less likely (dropped). The last bucket takes
// every token beyond max - 32; its mass is never needed (the cut defaults to it), so those
// tokens, usually most of a vocabulary, skip the histogram's dependent adds.
void apply_top_p(Truncation& t, float top_p) {
  constexpr size_t kBuckets = 2048;
  constexpr float kBucketsPerUnit = 64.0f;  // exact: a power of two
  const size_t n = t.weight.size();
  t.bucket_mass.assign(kBuckets, 0.0);
  t.bucket_of.resize(n);
  // Plain pointers: through the thread-local struct the compiler reloaded them every token.
  float* weight = t.weight.data();
  const float* scaled = t.scaled.data();
  uint16_t* bucket_of = t.bucket_of.data();
  double* bucket_mass = t.bucket_mass.data();
  for (size_t i = 0; i < n; ++i) {
    const float distance = (t.max_scaled - scaled[i]) * kBucketsPerUnit;
    const size_t b =
        distance < static_cast<float>(kBuckets - 1) ? static_cast<size_t>(distance) : kBuckets - 1;
    bucket_of[i] = static_cast<uint16_t>(b);
    if (b != kBuckets - 1 && weight[i] > 0.0f) bucket_mass[b] += weight[i];
  }
  const double target = static_cast<double>(top_p) * t.total;
  double before = 0.0;
  size_t cut = kBuckets - 1;
  for (size_t b = 0; b + 1 < kBuckets; ++b) {
    if (before + bucket_mass[b] >= target) {
      cut = b;
      break;
    }
    before += bucket_mass[b];
  }
  // Tokens past the cut bucket dropped without a branch (which of them lie past it is as
  // good as random in token order: a branch there mispredicted half the time); then the
  // cut bucket's kept tokens, few, collected.
  const auto cut_bucket = static_cast<uint16_t>(cut);
  for (size_t i = 0; i < n; ++i) {
    // A mask, not a select: GCC turned selects and multiplies by 0/1 back into branches.
    const uint32_t keep = 0u - static_cast<uint32_t>(bucket_of[i] <= cut_bucket);
    weight[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(weight[i]) & keep);
  }
  t.crossing.clear();
  for (size_t i = 0; i < n; ++i) {
    if (bucket_of[i] == cut_bucket && weight[i] > 0.0f) {
      t.crossing.push_back(static_cast<int32_t>(i));
    }
  }
  std::sort(t.crossing.begin(), t.crossing.end(), ByLikelihood{t.scaled.data()});
  double mass = before;
  for (size_t r = 0; r < t.crossing.size(); ++r) {
    const auto id = static_cast<size_t>(t.crossing[r]);
    const bool most_likely_token = cut == 0 && r == 0;  // always kept
    if (mass >= target && !most_likely_token) {
      t.weight[id] = 0.0f;
    } else {
      mass += t.weight[id];
    }
  }
}

// Fills `t` (its buffers reused) for the logits under params.
void truncate(std::span<const float> logits, const SamplingParams& params,
              std::span<const TokenId> generated, std::span<const TokenId> prompt, Truncation& t) {
  const size_t n = logits.size();
  t.scaled.assign(logits.begin(), logits.end());
  apply_penalties(t.scaled, params, generated, prompt);
  const float inv_temperature = 1.0f / params.temperature;
  for (float& v : t.scaled) {
    const float scaled = v * inv_temperature;
    v = scaled != scaled ? kNegInf : scaled;  // NaN: never drawn
  }
  t.top = static_cast<size_t>(argmax(t.scaled));
  t.max_scaled = t.scaled[t.top];
  t.weight.resize(n);
  if (t.max_scaled == kNegInf) {  // nothing has non-zero probability: keep the argmax
    std::fill(t.weight.begin(), t.weight.end(), 0.0f);
    t.top = static_cast<size_t>(argmax(logits));
    t.weight[t.top] = 1.0f;
    sum_blocks(t);
    return;
  }
  if (t.max_scaled == -kNegInf) {
    // A logit that is +inf, or overflows when scaled (or penalised: repetition_penalty 1e-38
    // is valid): softmax's limit, the +inf tokens alike. exp(inf - inf) would be NaN.
    for (size_t i = 0; i < n; ++i) t.weight[i] = t.scaled[i] == -kNegInf ? 1.0f : 0.0f;
    sum_blocks(t);
    return;
  }
  // exp in fp32 (several times faster than in double; within 2 ulp, far below what sampling
  // can observe), vectorized; sums in double.
  kernels::exp_offset(t.scaled.data(), t.max_scaled, t.weight.data(), static_cast<int64_t>(n));
  // top-k: drop everything below the k-th largest value (ties with it stay).
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    const float threshold = kth_largest(t.scaled, static_cast<size_t>(params.top_k));
    for (size_t i = 0; i < n; ++i) {
      if (t.scaled[i] < threshold) t.weight[i] = 0.0f;
    }
  }
  // min-p before top-p, as vLLM applies them: drop tokens whose probability is below min_p
  // times the largest one (weight 1, always kept); top-p then cuts the renormalised rest.
  // (top-k and min-p commute: both keep the most likely tokens.)
  if (params.min_p > 0.0f) {
    for (float& w : t.weight) {
      if (w < params.min_p) w = 0.0f;
    }
  }
  if (params.top_p < 1.0f) {
    sum_blocks(t);
    apply_top_p(t, params.top_p);
  }
  sum_blocks(t);
}

// The `count` most likely tokens (ByLikelihood's order; NaN never listed) with their
// logprobs: a bounded heap over the ids in order, which rejects a value below (or, coming
// later, equal to) the worst one kept with one comparison.
std::vector<TokenLogprob> top_entries(std::span<const float> values, double log_total, float offset,
                                      int32_t count) {
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(count, 0)), values.size());
  std::vector<int32_t> heap;  // ByLikelihood's heap: its front is the worst kept
  heap.reserve(k);
  const ByLikelihood better{values.data()};
  for (size_t i = 0; i < values.size() && k > 0; ++i) {
    const float v = values[i];
    if (v != v) continue;  // NaN
    if (heap.size() < k) {
      heap.push_back(static_cast<int32_t>(i));
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (v > values[static_cast<size_t>(heap.front())]) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = static_cast<int32_t>(i);
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  std::vector<TokenLogprob> out;
  out.reserve(heap.size());
  for (const int32_t id : heap) {
    out.push_back(
        {id, static_cast<float>(static_cast<double>(values[static_cast<size_t>(id)] - offset) -
                                log_total)});
  }
  return out;
}

// Logprobs as vLLM reports them by default ("raw_logprobs"): log_softmax of the model's
// logits, before penalties, temperature and truncation, for result->token and the
// params.top_logprobs most likely tokens. exp in fp32 (vectorized, within 2 ulp), summed in
// double.
void describe_raw(std::span<const float> logits, const SamplingParams& params,
                  SampledToken* result) {
  const float max_value = logits[static_cast<size_t>(argmax(logits))];
  const float token_logit = logits[static_cast<size_t>(result->token)];
  if (!(max_value > kNegInf && max_value < -kNegInf)) {
    // Softmax's limits, as the draw takes them: the +inf logits share the mass; with none
    // (every logit -inf or NaN) nothing has any. (exp(inf - inf) made every logprob NaN.)
    size_t infinite = 0;
    for (const float v : logits) infinite += v == -kNegInf;
    const float share = infinite > 0 ? -std::log(static_cast<float>(infinite)) : kNegInf;
    const auto logprob = [&](float v) { return v == -kNegInf ? share : kNegInf; };
    result->logprob = logprob(token_logit);
    result->top_logprobs = top_entries(logits, 0.0, 0.0f, params.top_logprobs);
    for (TokenLogprob& e : result->top_logprobs) {
      e.logprob = logprob(logits[static_cast<size_t>(e.token)]);
    }
    return;
  }
  thread_local std::vector<float> weights;
  weights.resize(logits.size());
  kernels::exp_offset(logits.data(), max_value, weights.data(),
                      static_cast<int64_t>(logits.size()));
  // Independent chains; a NaN logit has probability 0, as in the draw (it poisoned every
  // logprob before).
  double sums[4] = {0.0, 0.0, 0.0, 0.0};
  auto mass = [](float w) { return w == w ? static_cast<double>(w) : 0.0; };
  size_t i = 0;
  for (; i + 4 <= weights.size(); i += 4) {
    for (size_t j = 0; j < 4; ++j) sums[j] += mass(weights[i + j]);
  }
  for (; i < weights.size(); ++i) sums[0] += mass(weights[i]);
  const double log_total = std::log((sums[0] + sums[1]) + (sums[2] + sums[3]));
  result->logprob =
      token_logit == token_logit  // a NaN logit (drawn only when forced) has probability 0
          ? static_cast<float>(static_cast<double>(token_logit - max_value) - log_total)
          : kNegInf;
  result->top_logprobs = top_entries(logits, log_total, max_value, params.top_logprobs);
}

}  // namespace

bool is_greedy(const SamplingParams& params) {
  return params.temperature < kGreedyTemperature;
}

Status SamplingParams::validate() const {
  const auto out_of = [](const char* field, double value, const char* range) {
    // %g: integers print as integers (top_k = -5, not -5.000000), 1e40 as 1e+40.
    char text[32];
    std::snprintf(text, sizeof(text), "%g", value);
    return invalid_argument(std::string("sampling: ") + field + " = " + text + ", expected " +
                            range);
  };
  if (min_tokens < 0) return out_of("min_tokens", min_tokens, ">= 0");
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return out_of("temperature", temperature, "a finite value >= 0 (0 = greedy)");
  }
  if (top_k < -1) return out_of("top_k", top_k, ">= 0 (0 or -1 = off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return out_of("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return out_of("min_p", min_p, "in [0, 1]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return out_of("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return out_of("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return out_of("repetition_penalty", repetition_penalty, "a finite value > 0 (1 = off)");
  }
  for (const auto& [id, bias] : logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return out_of("logit_bias", bias, "in [-100, 100]");
    }
  }
  if (top_logprobs < 0 || top_logprobs > 20)
    return out_of("top_logprobs", top_logprobs, "in [0, 20]");
  if (top_logprobs > 0 && !want_logprobs) {
    return invalid_argument("sampling: top_logprobs = " + std::to_string(top_logprobs) +
                            " needs logprobs to be enabled");
  }
  return ok_status();
}

namespace {

void apply_other_penalties(std::span<float> logits, const SamplingParams& params,
                           std::span<const TokenId> generated, std::span<const TokenId> prompt) {
  if (generated.size() < params.forced_tokens.size()) {
    const TokenId forced = params.forced_tokens[generated.size()];
    PS_CHECK(forced >= 0 && static_cast<size_t>(forced) < logits.size())
        << "forced token " << forced;
    const float kept = logits[static_cast<size_t>(forced)];
    std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
    logits[static_cast<size_t>(forced)] = std::isfinite(kept) ? kept : 0.0f;
    return;
  }
  if (!params.allowed_token_ids.empty()) {
    std::vector<bool> allowed(logits.size(), false);
    for (const TokenId id : params.allowed_token_ids) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size())
        allowed[static_cast<size_t>(id)] = true;
    }
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!allowed[i]) logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
  for (const std::vector<TokenId>& word : params.bad_words_ids) {
    if (word.empty() || word.size() - 1 > generated.size()) continue;
    const size_t prefix = word.size() - 1;
    if (!std::equal(word.begin(), word.begin() + static_cast<ptrdiff_t>(prefix),
                    generated.end() - static_cast<ptrdiff_t>(prefix))) {
      continue;
    }
    const TokenId last = word.back();
    if (last >= 0 && static_cast<size_t>(last) < logits.size()) {
      logits[static_cast<size_t>(last)] = -std::numeric_limits<float>::infinity();
    }
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[static_cast<size_t>(id)] += bias;
  }
  if (static_cast<int64_t>(generated.size()) < params.min_tokens) {
    for (const TokenId id : params.suppressed_until_min_tokens) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) {
        logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  if (params.repetition_penalty != 1.0f) {
    // Every token seen so far, the prompt's too (vLLM, transformers), once each.
    std::vector<bool> seen(logits.size(), false);
    for (std::span<const TokenId> tokens : {prompt, generated}) {
      for (const TokenId id : tokens) {
        if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;  // not in the vocab
        if (seen[static_cast<size_t>(id)]) continue;
        seen[static_cast<size_t>(id)] = true;
        float& logit = logits[static_cast<size_t>(id)];
        logit =
            logit > 0.0f ? logit / params.repetition_penalty : logit * params.repetition_penalty;
      }
    }
  }
  if (generated.empty() || (params.frequency_penalty == 0.0f && params.presence_penalty == 0.0f)) {
    return;
  }
  // OpenAI's frequency and presence penalties count the generated tokens only.
  std::unordered_map<TokenId, int32_t> counts;
  counts.reserve(generated.size());
  for (TokenId id : generated) {
    PS_CHECK(id >= 0 && static_cast<size_t>(id) < logits.size()) << "generated token " << id;
    ++counts[id];
  }
  for (const auto& [id, count] : counts) {
    logits[static_cast<size_t>(id)] -=
        params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
  }
}

// The structured-output constraint, after every other step. Should the request's other
// restrictions (min_tokens, allowed_token_ids, a -100 bias) leave none of the constraint's
// tokens, those tokens are kept as equals: the constraint always leaves a way to go on or end.
void apply_constraint(std::span<float> logits, const SamplingParams& params,
                      std::span<const TokenId> generated) {
  if (!params.constraint) return;
  params.constraint->mask_logits(logits, generated);
  for (const float x : logits) {
    if (x > -std::numeric_limits<float>::infinity()) return;
  }
  const grammar::TokenConstraint& c = *params.constraint;
  const std::vector<uint64_t>& allowed = c.allowed(c.state_after(generated));
  const size_t n = std::min(logits.size(), static_cast<size_t>(c.vocabulary().vocab_size()));
  for (size_t i = 0; i < n; ++i) {
    if ((allowed[i / 64] >> (i % 64)) & 1u) logits[i] = 0.0f;
  }
}

}  // namespace

void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const TokenId> generated, std::span<const TokenId> prompt) {
  if (!has_penalties(params)) return;
  apply_other_penalties(logits, params, generated, prompt);
  // The testing hook's forced token is what the model "says", constraint or not.
  if (generated.size() >= params.forced_tokens.size()) apply_constraint(logits, params, generated);
}

TokenDistribution final_distribution(std::span<const float> logits, const SamplingParams& params,
                                     std::span<const TokenId> generated,
                                     std::span<const TokenId> prompt) {
  PS_CHECK(!logits.empty());
  TokenDistribution out;
  if (is_greedy(params)) {
    std::vector<float> work(logits.begin(), logits.end());
    apply_penalties(work, params, generated, prompt);
    out.tokens.push_back(argmax(work));
    out.probs.push_back(1.0);
    return out;
  }
  Truncation& t = thread_truncation();
  truncate(logits, params, generated, prompt, t);
  for (size_t i = 0; i < t.weight.size(); ++i) {
    if (t.weight[i] > 0.0f) {
      out.tokens.push_back(static_cast<TokenId>(i));
      out.probs.push_back(static_cast<double>(t.weight[i]) / t.total);
    }
  }
  return out;
}

namespace {

// The exponential race (the Gumbel-max trick): the kept token i with the largest
// weight[i] / E_i, where E_i = -ln U_i and U_i is uniform on (0, 1), counter-based on (seed,
// output position, token): a draw from weight / total. Another distribution raced with the
// same U_i (the MTP draft's, runtime/speculative_sampler.h) picks the same token with
// probability >= (1 - TV) / (1 + TV) (Daliri, Musco and Suresh, "Coupling without
// communication and drafter-invariant speculative decoding", 2024), in any token order. The
// inverse CDF in token order, drawn before, coupled two distributions poorly: every token
// before the drawn one shifts its interval (sampled MTP drafts, T = 0.8: 36% accepted with
// the same uniform, 66% with the race, 70% under rejection sampling, which speculative
// decoding no longer uses: its emitted token depended on whether there was a draft).
TokenId race(Truncation& t, uint64_t seed, uint64_t position) {
  constexpr uint64_t kRaceStream = 0x5851F42D4C957F2DULL;
  const uint64_t base = splitmix64_mix(seed + kSplitMix64Gamma * (position + 1)) ^ kRaceStream;
  const float* weight = t.weight.data();
  // The most likely token sets the bar: the others must beat weight / E with E >= 1 - U,
  // which few do (kernels/race_uniforms.h lists them, a vector of hashes at a time); the
  // logarithm is taken for those only.
  size_t chosen = t.top;
  double best =
      static_cast<double>(weight[chosen]) / -std::log(kernels::race_uniform(base, chosen));
  t.candidates.resize(t.weight.size());
  const size_t count =
      kernels::race_candidates(weight, t.weight.size(), base, best, t.candidates.data());
  for (size_t c = 0; c < count; ++c) {
    const size_t i = t.candidates[c];
    if (i == t.top) continue;
    const double w = weight[i];
    const double e = -std::log(kernels::race_uniform(base, i));
    if (w > e * best) {
      best = w / e;
      chosen = i;
    }
  }
  return static_cast<TokenId>(chosen);
}

}  // namespace

SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          const SamplingContext& context) {
  PS_CHECK(!logits.empty());
  SampledToken result;
  if (is_greedy(params)) {
    if (!has_penalties(params) && !params.want_logprobs) {
      result.token = argmax(logits);
      return result;
    }
    std::vector<float> work(logits.begin(), logits.end());
    apply_penalties(work, params, context.generated, context.prompt);
    result.token = argmax(work);
    if (params.want_logprobs) describe_raw(logits, params, &result);
    return result;
  }

  Truncation& t = thread_truncation();
  truncate(logits, params, context.generated, context.prompt, t);
  result.token = race(t, context.seed, context.generated.size());
  if (params.want_logprobs) describe_raw(logits, params, &result);
  return result;
}

SampledToken describe_token(std::span<const float> logits, const SamplingParams& params,
                            TokenId token) {
  PS_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size()) << "token " << token;
  SampledToken result;
  result.token = token;
  if (params.want_logprobs) describe_raw(logits, params, &result);
  return result;
}

PromptTokenLogprob describe_prompt_token(std::span<const float> logits, TokenId token,
                                         int32_t top) {
  PS_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size()) << "token " << token;
  SamplingParams params;
  params.want_logprobs = true;
  params.top_logprobs = top;
  SampledToken described;
  described.token = token;
  describe_raw(logits, params, &described);
  PromptTokenLogprob result;
  result.token = token;
  result.logprob = described.logprob;
  result.top_logprobs = std::move(described.top_logprobs);
  const float value = logits[static_cast<size_t>(token)];
  int64_t larger = 0;
  for (const float v : logits) larger += v > value;  // a NaN logit counts for nothing
  result.rank =
      static_cast<int32_t>(std::min<int64_t>(larger + 1, std::numeric_limits<int32_t>::max()));
  return result;
}

}  // namespace peerserve
