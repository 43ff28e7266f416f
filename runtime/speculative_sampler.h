// Speculative sampling: proposing draft tokens from the MTP layer's logits and verifying them
// against the main model's logits so that the emitted tokens have exactly the distribution
// of ordinary sampling (Leviathan et al., "Fast Inference from Transformers via Speculative
// Decoding", and paper 000 §4.2.4).
//
// Greedy requests: the draft is the argmax of the (penalised) draft logits; it is accepted
// when it equals the main model's greedy token, which is emitted either way, so the output is
// token for token that of non-speculative decoding.
// Sampled requests: the draft x is drawn from q, the draft logits' final distribution (the
// request's penalties, temperature, top-k, top-p and min-p applied, sampler.h); the main
// model's final distribution p at the same position accepts it with probability
// min(1, p(x) / q(x)); on rejection the emitted token is drawn from normalise(max(0, p - q)).
// Then the emitted token has distribution p exactly.
//
// All draws are counter-based (sampling_uniform) on the request's seed and the output
// position, on streams of their own, so a seeded request reproduces exactly.
#pragma once

#include <span>

#include "runtime/sampler.h"

namespace peerserve {

struct DraftToken {
  TokenId token = 0;
  // q, the distribution the draft was drawn from; empty for a greedy request.
  TokenDistribution q;
};

// Proposes the token at output position context.generated.size() (context.generated holds
// the tokens before it: generated ones, then earlier drafts).
DraftToken propose_draft(std::span<const float> draft_logits, const SamplingParams& params,
                         const SamplingContext& context);

struct DraftVerdict {
  bool accepted = false;
  // The emitted token: the draft when accepted, otherwise its replacement (with logprobs from
  // the main model's final distribution when the request asks for them).
  SampledToken token;
};

// Verifies `draft` against the main model's logits for the same position (context as in
// propose_draft).
DraftVerdict verify_draft(std::span<const float> target_logits, const SamplingParams& params,
                          const SamplingContext& context, const DraftToken& draft);

}  // namespace peerserve
