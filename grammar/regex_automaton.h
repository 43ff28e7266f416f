// A regular expression compiled to a deterministic automaton over UTF-8 bytes, for
// structured outputs: the token masks of grammar/token_constraint.h walk it byte by byte.
//
// Why not a library: PCRE2 (already a dependency) and RE2 match strings but do not expose
// automaton states, and a token mask needs "which state does this prefix leave the
// matcher in" for every vocabulary entry (as Outlines and xgrammar compute it).
//
// The language is full-match: the automaton accepts a byte string when the whole string
// matches. Syntax (Python's `re` and ECMAScript agree on all of it):
//   literals (any UTF-8 character), `.` (any character but \n), escapes \\ \. \* \+ \? \(
//   \) \[ \] \{ \} \| \^ \$ \- \/ \" \' \, \: \# \& \~ \< \> \= \! \% \@ \` \; and space,
//   \n \r \t \f \v \0, \d \D \w \W \s \S (ASCII classes), \xHH, \uHHHH;
//   classes [...] and [^...] with ranges (a negated class matches every Unicode scalar
//   value not listed); groups (...) and (?:...); alternation |; quantifiers * + ? {n}
//   {n,} {n,m} (n, m <= 1000; a trailing ? is accepted and means nothing here);
//   ^ at the very start and $ at the very end (no-ops under full match).
// Anything else (backreferences, lookaround, named groups, flags) is refused with an error
// naming the offset. Sizes are bounded: the pattern, its nesting, the automaton's states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve::grammar {

struct RegexLimits {
  size_t max_pattern_bytes = 1 << 20;
  int max_nesting = 256;            // parentheses and classes inside each other
  size_t max_nfa_states = 1 << 20;  // after expanding counted repetition
  size_t max_dfa_states = 1 << 16;
  // Work bounds (NFA states visited while building; row entries compared while minimizing),
  // so that a hostile pattern costs at most a second or two. Past the first the pattern is
  // refused; past the second the automaton is kept unminimized (correct, only larger).
  uint64_t max_construction_steps = 200'000'000;
  uint64_t max_minimization_steps = 200'000'000;
};

class RegexAutomaton {
 public:
  static constexpr int32_t kDead = -1;

  static Result<std::shared_ptr<const RegexAutomaton>> compile(std::string_view pattern,
                                                               const RegexLimits& limits = {});

  int32_t start() const { return 0; }
  // The state after `byte`, or kDead when no continuation of the string can match.
  int32_t step(int32_t state, uint8_t byte) const {
    return transitions_[static_cast<size_t>(state) * num_classes_ + byte_class_[byte]];
  }
  // The state after `bytes` (kDead as soon as one byte leads nowhere).
  int32_t walk(int32_t state, std::string_view bytes) const;
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Whether some non-empty continuation from `state` matches.
  bool can_continue(int32_t state) const;
  bool matches(std::string_view bytes) const {
    const int32_t s = walk(start(), bytes);
    return s != kDead && accepting(s);
  }

  size_t num_states() const { return accepting_.size(); }
  const std::string& pattern() const { return pattern_; }

  // Use compile().
  RegexAutomaton(std::string pattern, std::vector<uint8_t> byte_class, size_t num_classes,
                 std::vector<int32_t> transitions, std::vector<uint8_t> accepting);

 private:
  std::string pattern_;
  std::vector<uint8_t> byte_class_;  // [256]
  size_t num_classes_ = 0;
  std::vector<int32_t> transitions_;  // [state][class]; every state can still reach a match
  std::vector<uint8_t> accepting_;
};

// The pattern with every metacharacter of the syntax above escaped and control characters as
// \xHH: it matches `text` only (UTF-8 passes through unchanged).
std::string escape_regex(std::string_view text);

}  // namespace peerserve::grammar
