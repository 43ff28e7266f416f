// Structured outputs: which tokens keep a generation inside a regular language.
//
// A constraint pairs a compiled pattern (grammar/regex_automaton.h) with a vocabulary
// (grammar/token_vocabulary.h). The state after a sequence of generated tokens is the
// automaton's state after their bytes; a token is allowed at a state when its bytes lead to
// a state from which a match is still reachable. The end tokens (EOS) are allowed where the
// text so far is a whole match, and are the only ones allowed when no token fits (a
// language no token of the vocabulary can continue), so generation always has a way out.
//
// Masks are computed on first use of a state and cached (a walk of the vocabulary's trie
// beside the automaton; ~ms for a 129k-token vocabulary). Thread-safe: the cache is behind a
// mutex, everything else is immutable. Shared by every request with the same pattern.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/regex_automaton.h"
#include "grammar/token_vocabulary.h"

namespace peerserve::grammar {

class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const RegexAutomaton> automaton,
                  std::shared_ptr<const TokenVocabulary> vocabulary);

  const RegexAutomaton& automaton() const { return *automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

  // The state after `tokens` from the start; RegexAutomaton::kDead once a token left the
  // language (an end token included).
  int32_t state_after(std::span<const TokenId> tokens) const;
  int32_t advance(int32_t state, TokenId token) const;

  // The allowed token ids at `state` as a bitset over [0, vocabulary().vocab_size()). The
  // reference stays valid while the constraint lives, except past kMaxCachedStates cached
  // states: then until the calling thread's next call.
  const std::vector<uint64_t>& allowed(int32_t state) const;
  // 16 KB per state at a 129k vocabulary: at most 8 MB of masks per constraint.
  static constexpr size_t kMaxCachedStates = 512;
  // Sets every logit of a token not allowed after `generated` to -inf (ids at or past the
  // vocabulary's size too).
  void mask_logits(std::span<float> logits, std::span<const TokenId> generated) const;

 private:
  std::vector<uint64_t> compute_mask(int32_t state) const;

  std::shared_ptr<const RegexAutomaton> automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<uint64_t> end_only_;
  mutable std::mutex mutex_;
  // Node-based: references stay valid while other states are added.
  mutable std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
};

}  // namespace peerserve::grammar
