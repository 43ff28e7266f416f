// Structured outputs as vLLM and OpenAI clients ask for them, turned into one regular
// expression and compiled against the model's vocabulary (grammar/).
//
// Request fields (at most one kind per request):
//   vLLM's guided_json (a schema, or its JSON text), guided_regex, guided_choice (strings),
//   with guided_whitespace_pattern for JSON; vLLM's structured_outputs {json | regex | choice
//   | json_object} with whitespace_pattern; OpenAI's response_format {"type": "json_object"}
//   or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} ("text": none).
// Refused with a 400 naming the field: guided_grammar and structured_outputs' grammar and
// structural_tag (no grammar engine here), schemas using keywords the converter cannot
// express (grammar/json_schema_regex.h), patterns outside grammar/regex_automaton.h's syntax.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

struct StructuredOutputRequest {
  std::string pattern;  // the regular expression the whole answer must match
  std::string field;    // the request field it came from (an error's `param`)
};

// A refused field: the protocol answers 400 with code invalid_value, or unsupported_parameter.
struct StructuredOutputError {
  std::string field;
  std::string message;
  bool unsupported = false;
};

// The top-level members of a request body that parse_structured_output reads.
inline constexpr std::string_view kStructuredOutputMembers[] = {"guided_json",
                                                                "guided_regex",
                                                                "guided_choice",
                                                                "guided_grammar",
                                                                "guided_whitespace_pattern",
                                                                "structured_outputs",
                                                                "response_format"};

// Reads the fields above from a request body. nullopt in *out when none asks for anything.
// A schema's properties come in the order its object iterates them: sorted for
// nlohmann::json, as sent for nlohmann::ordered_json (what the server compiles).
std::optional<StructuredOutputError> parse_structured_output(
    const nlohmann::json& body, std::optional<StructuredOutputRequest>* out);
std::optional<StructuredOutputError> parse_structured_output(
    const nlohmann::ordered_json& body, std::optional<StructuredOutputRequest>* out);

// Compiles patterns into token constraints for one tokenizer, keeping the most recently used
// ones (a schema sent with every request compiles once). With their cached masks (at most
// TokenConstraint::kMaxCachedStates each) 16 of them hold at most 128 MB at a 129k
// vocabulary, plus their automata. The most recent refusals are kept too, as many again: a
// pattern over the automaton's bounds costs a second or two of work before it is refused, and
// a client that sends the same one with every request (a large tool set with a forced call,
// which then falls back to a smaller pattern) would pay that each time. Thread-safe.
class StructuredOutputCompiler {
 public:
  // `tokenizer` must outlive the compiler; `end_tokens`: the model's EOS ids.
  StructuredOutputCompiler(const Tokenizer& tokenizer, std::vector<TokenId> end_tokens,
                           size_t cache_entries = 16);

  Result<std::shared_ptr<const grammar::TokenConstraint>> compile(const std::string& pattern);

  // Compilations run so far (cache hits and remembered refusals excluded): for tests.
  size_t compilations() const;

 private:
  const Tokenizer& tokenizer_;
  std::vector<TokenId> end_tokens_;
  size_t cache_entries_;
  mutable std::mutex mutex_;
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;  // built on first use
  // Most recently used first.
  // The indexes view their list's patterns (list nodes do not move), so each is held once.
  std::list<std::pair<std::string, std::shared_ptr<const grammar::TokenConstraint>>> lru_;
  std::unordered_map<std::string_view, decltype(lru_)::iterator> index_;
  // Refused patterns, most recent first (at most cache_entries_), with why. Patterns longer
  // than the automaton takes at all are refused at once and not kept.
  std::list<std::pair<std::string, Status>> refused_;
  std::unordered_map<std::string_view, decltype(refused_)::iterator> refused_index_;
  size_t compilations_ = 0;
};

}  // namespace peerserve
