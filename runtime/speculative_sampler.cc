#include "runtime/speculative_sampler.h"

namespace peerserve {

DraftToken propose_draft(std::span<const float> draft_logits, const SamplingParams& params,
                         const SamplingContext& context) {
  // Ordinary sampling's own draw, on the draft logits: the same race, with the same
  // per-token exponentials, as the target's draw in verify_draft.
  SamplingParams plain = params;
  plain.want_logprobs = false;
  plain.top_logprobs = 0;
  return {.token = sample_token(draft_logits, plain, context).token};
}

DraftVerdict verify_draft(std::span<const float> target_logits, const SamplingParams& params,
                          const SamplingContext& context, const DraftToken& draft) {
  // The token ordinary sampling emits here: the draft only decides whether it was known a
  // step early.
  DraftVerdict verdict;
  verdict.token = sample_token(target_logits, params, context);
  verdict.accepted = verdict.token.token == draft.token;
  return verdict;
}

}  // namespace peerserve
