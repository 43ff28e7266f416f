// libFuzzer target: arbitrary bytes as a structured-output request's pattern, through the same
// steps as the server: the first byte picks a guided_regex (the rest is the pattern) or a
// guided_json schema (the rest is JSON text, converted to a pattern); the pattern is compiled
// into an automaton (with smaller work bounds than the server's, to keep each input fast) and
// the token mask of the start state and of a short walk is taken over the shipped model's
// vocabulary. Every input must end in a constraint or an error.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "grammar/json_schema_regex.h"
#include "grammar/regex_automaton.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

std::shared_ptr<const peerserve::grammar::TokenVocabulary> shipped_vocabulary() {
  static const std::shared_ptr<const peerserve::grammar::TokenVocabulary> vocabulary = [] {
    auto loaded =
        peerserve::Tokenizer::load_from_dir(PEERSERVE_SOURCE_DIR "/models/peerserve-dsv3-tiny");
    if (!loaded.ok()) __builtin_trap();
    const peerserve::Tokenizer& t = *loaded;
    return peerserve::grammar::TokenVocabulary::build(
        t.vocab_size(),
        [&](peerserve::TokenId id) -> std::optional<std::string_view> {
          if (!t.has_token(id) || t.is_special(id)) return std::nullopt;
          return t.token_bytes(id);
        },
        {1});
  }();
  return vocabulary;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  namespace g = peerserve::grammar;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string pattern;
  if (data[0] % 2 == 0) {
    pattern = rest;
  } else {
    const auto schema = nlohmann::ordered_json::parse(rest, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    auto converted = g::json_schema_to_regex(schema);
    if (!converted.ok()) return 0;
    pattern = std::move(converted).value();
  }
  g::RegexLimits limits;
  limits.max_nfa_states = 1 << 16;
  limits.max_dfa_states = 1 << 12;
  limits.max_construction_steps = 5'000'000;
  limits.max_minimization_steps = 5'000'000;
  auto automaton = g::RegexAutomaton::compile(pattern, limits);
  if (!automaton.ok()) return 0;
  const g::TokenConstraint constraint(*automaton, shipped_vocabulary());
  int32_t state = (*automaton)->start();
  for (int step = 0; step < 4 && state != g::RegexAutomaton::kDead; ++step) {
    const std::vector<uint64_t>& allowed = constraint.allowed(state);
    // The first allowed token (or none): a walk the sampler could take.
    peerserve::TokenId next = -1;
    for (size_t w = 0; w < allowed.size() && next < 0; ++w) {
      if (allowed[w] != 0) {
        next = static_cast<peerserve::TokenId>(w * 64 +
                                               static_cast<size_t>(__builtin_ctzll(allowed[w])));
      }
    }
    if (next < 0) __builtin_trap();  // a mask always allows something (EOS at least)
    state = constraint.advance(state, next);
  }
  return 0;
}
