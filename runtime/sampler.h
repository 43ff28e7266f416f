// Sampler: picks the next token from one row of logits, per request.
//
// Pure functions: the result depends only on the logits, the request's SamplingParams,
// its generated tokens so far and its seed, never on the batch it ran in, so that a
// seeded request reproduces exactly (with speculative decoding too: it emits what this draws,
// runtime/speculative_sampler.h). The random draws for output position t of a request are
// counter-based hashes of (seed, t, token), so no RNG state has to be carried or shared;
// sampled requests draw by an exponential race over the kept tokens (sample_token).
//
// Order of processing (vLLM's):
//   1. allowed_token_ids, bad_words, logit_bias, then penalties: repetition_penalty over
//      every token seen so far, the prompt's and the generated ones (CTRL/transformers/vLLM:
//      positive logits divided by it, negative ones multiplied), then OpenAI's frequency/presence
//      penalties over the generated tokens:
//        logit[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0);
//      and last the structured-output constraint (tokens that would leave its language get
//      probability 0; should nothing be left, the constraint's tokens are kept as equals);
//   2. temperature below kGreedyTemperature (0 in practice): greedy, the argmax (lowest id
//      on ties); otherwise logits / temperature;
//   3. min_p, then top_k, then top_p truncation of softmax(logits / temperature);
//   4. a draw from the renormalised remaining distribution.
//
// Logprobs as vLLM reports them by default (logprobs_mode "raw_logprobs"): log_softmax of
// the model's logits, before penalties, temperature and truncation, whatever the request's
// sampling parameters; the top entries are the most likely tokens of that distribution.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"
#include "grammar/token_constraint.h"

namespace peerserve {

using TokenId = int32_t;

struct SamplingParams {
  // 0 = greedy. Default: 1 (OpenAI).
  float temperature = 1.0f;
  // Keep the k most likely tokens (and any tied with the k-th, as transformers does);
  // 0 or -1 = off. Default: 0.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose mass reaches top_p (ties ordered by
  // lower id first); 1 = off.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p * (the largest probability); 0 = off.
  float min_p = 0.0f;
  // OpenAI semantics, range [-2, 2]. Default: 0.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Multiplicative penalty (> 0) for tokens of the prompt or already generated; 1 = off.
  float repetition_penalty = 1.0f;
  // OpenAI's logit_bias: added to the token's logit before the penalties (vLLM's order),
  // each in [-100, 100]; ids must be in the vocabulary (the engine checks).
  std::vector<std::pair<TokenId, float>> logit_bias;
  // Per-request seed; requests without one get a seed drawn by the runtime at admission.
  std::optional<uint64_t> seed;
  // Number of top log-probabilities to report per position (OpenAI top_logprobs, 0..20);
  // the chosen token's logprob is reported whenever want_logprobs is true.
  bool want_logprobs = false;
  int32_t top_logprobs = 0;
  // vLLM's min_tokens: while fewer than min_tokens tokens have been generated, the tokens
  // in suppressed_until_min_tokens (the engine puts EOS and the stop token ids there) get
  // probability 0 (logit -inf, applied with the penalties in step 1).
  int32_t min_tokens = 0;
  std::vector<TokenId> suppressed_until_min_tokens;
  // vLLM's allowed_token_ids: when not empty, every other token gets probability 0 (applied
  // first in step 1; logprobs stay the model's). Ids must be in the vocabulary (the engine
  // checks).
  std::vector<TokenId> allowed_token_ids;
  // vLLM's bad_words, as token sequences: a one-token word always gets probability 0; a
  // longer one's last token gets probability 0 when the generated tokens end with the rest
  // of it (vLLM's rule; the prompt does not count). Ids must be in the vocabulary (the engine
  // checks).
  std::vector<std::vector<TokenId>> bad_words_ids;
  // Structured outputs (guided_regex, guided_choice, guided_json, response_format): only
  // tokens that keep the generated text inside the constraint's language, and EOS where the
  // text is a whole match (grammar/token_constraint.h). Shared, immutable.
  std::shared_ptr<const grammar::TokenConstraint> constraint;
  // Testing hook (serve --allow-forced-output): at output position t < forced_tokens.size()
  // every token but forced_tokens[t] gets probability 0 (applied with the penalties in
  // step 1), so a test decides what the model "says" while the whole serving path runs.
  std::vector<TokenId> forced_tokens;

  // Checks ranges; the message names the field and the accepted range.
  Status validate() const;
};

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  TokenId token = 0;
  // Log-probability of `token` under the model's logits (0 unless want_logprobs).
  float logprob = 0.0f;
  // Most likely first (ties: lower id first), top_logprobs of them.
  std::vector<TokenLogprob> top_logprobs;
};

// Everything about the request that the draw depends on besides the logits.
struct SamplingContext {
  // Tokens generated so far for this request (the prompt excluded); its size is the
  // output position t that selects the random draw.
  std::span<const TokenId> generated = {};
  // The request's resolved seed.
  uint64_t seed = 0;
  // The request's prompt: repetition_penalty counts its tokens too.
  std::span<const TokenId> prompt = {};
};

// Temperatures below this are greedy (vLLM's _SAMPLING_EPS): 1 / temperature would overflow
// for the smallest ones, and the distribution is the argmax to float precision anyway.
inline constexpr float kGreedyTemperature = 1e-5f;
bool is_greedy(const SamplingParams& params);

// Samples one token from `logits` (one row, vocab-sized). REQUIRES: params.validate() ok,
// logits non-empty and free of NaN, every generated id in [0, logits.size()).
SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          const SamplingContext& context);

// The SampledToken that sample_token reports when it draws `token` (its logprob and the top
// logprobs): for tokens chosen by speculative decoding.
// REQUIRES: as sample_token, and token in [0, logits.size()).
SampledToken describe_token(std::span<const float> logits, const SamplingParams& params,
                            TokenId token);

// A prompt token's log-probability given the tokens before it (vLLM's prompt_logprobs), as
// describe_token reports it (raw logprobs), with its rank: 1 + the number of tokens whose
// logit is larger (vLLM's), so 1 for the argmax.
struct PromptTokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top_logprobs;  // most likely first, `top` of them
};
// REQUIRES: logits non-empty, token in [0, logits.size()), top in [0, 20].
PromptTokenLogprob describe_prompt_token(std::span<const float> logits, TokenId token, int32_t top);

// The distribution sample_token draws from: the kept tokens in ascending id order and
// their probabilities (summing to 1). For greedy requests, the single argmax token.
struct TokenDistribution {
  std::vector<TokenId> tokens;
  std::vector<double> probs;
};
TokenDistribution final_distribution(std::span<const float> logits, const SamplingParams& params,
                                     std::span<const TokenId> generated,
                                     std::span<const TokenId> prompt = {});

// Applies step 1 (penalties, min_tokens suppression) in place; exposed for tests and for
// MTP verification.
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const TokenId> generated, std::span<const TokenId> prompt = {});

}  // namespace peerserve
