// Speculative sampling: proposing draft tokens from the MTP layer's logits and verifying them
// against the main model's logits (paper 000 §4.2.4), so that every emitted token is the one
// ordinary sampling emits: for greedy requests and sampled ones alike, the output is token
// for token that of non-speculative decoding with the same seed, however the steps were
// batched and whether or not a position got a draft (which depends on the load).
//
// Sampled requests use a coupled draw instead of Leviathan et al.'s rejection sampling
// (accept x ~ q with probability min(1, p(x) / q(x)), else draw from max(0, p - q)). That
// one also emits tokens distributed as p, but which token depends on the draft, and a
// position gets a draft only when the step has room for it: a seeded request's text then
// changed with the server's load. Here the target's token is the one ordinary sampling
// draws (sample_token's exponential race over p), and the draft is the same race over q
// with the same per-token exponentials; the draft is accepted when the two races pick the
// same token, with probability >= (1 - TV) / (1 + TV) and at most sum_x min(p(x), q(x)),
// rejection sampling's rate (docs/speculative_decoding.md).
#pragma once

#include <span>

#include "runtime/sampler.h"

namespace peerserve {

struct DraftToken {
  TokenId token = 0;
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
