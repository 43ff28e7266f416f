#include "serve/structured_output.h"

#include <utility>

#include "grammar/json_schema_regex.h"
#include "grammar/regex_automaton.h"

namespace peerserve {
namespace {

StructuredOutputError field_error(const std::string& field, const std::string& message,
                                  bool unsupported = false) {
  return {field, message, unsupported};
}

template <typename Json>
std::string type_of(const Json& v) {
  return v.type_name();
}

// One requested kind: the field that asked and the pattern it means.
struct Ask {
  std::string field;
  std::string pattern;
};

template <typename Json>
std::optional<StructuredOutputError> schema_pattern(const Json& schema, const std::string& field,
                                                    const grammar::JsonRegexOptions& options,
                                                    Ask* out) {
  Json parsed;
  const Json* s = &schema;
  if (schema.is_string()) {  // vLLM takes the schema's JSON text too
    parsed = Json::parse(schema.template get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return field_error(field, "'" + field + "' is a string that is not a JSON schema");
    }
    s = &parsed;
  }
  if (!s->is_object() && !s->is_boolean()) {
    return field_error(field,
                       "'" + field + "' must be a JSON schema (an object), got " + type_of(*s));
  }
  Result<std::string> pattern = grammar::json_schema_to_regex(*s, options);
  if (!pattern.ok()) {
    return field_error(field, "'" + field + "': " + pattern.status().message(), true);
  }
  *out = {field, std::move(pattern).value()};
  return std::nullopt;
}

template <typename Json>
std::optional<StructuredOutputError> choice_pattern(const Json& choices, const std::string& field,
                                                    Ask* out) {
  if (!choices.is_array() || choices.empty()) {
    return field_error(field, "'" + field + "' must be a non-empty array of strings");
  }
  std::string pattern;
  for (const Json& c : choices) {
    if (!c.is_string()) {
      return field_error(field, "'" + field + "' must hold strings only, got " + type_of(c));
    }
    pattern +=
        (pattern.empty() ? "(?:" : "|") + grammar::escape_regex(c.template get<std::string>());
  }
  *out = {field, pattern + ")"};
  return std::nullopt;
}

template <typename Json>
std::optional<StructuredOutputError> regex_pattern(const Json& regex, const std::string& field,
                                                   Ask* out) {
  if (!regex.is_string() || regex.template get<std::string>().empty()) {
    return field_error(field, "'" + field + "' must be a non-empty string");
  }
  *out = {field, regex.template get<std::string>()};
  return std::nullopt;
}

template <typename Json>
std::optional<StructuredOutputError> whitespace_option(const Json* v, const std::string& field,
                                                       grammar::JsonRegexOptions* options) {
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_string()) return field_error(field, "'" + field + "' must be a string");
  options->whitespace = v->template get<std::string>();
  if (Status s = grammar::check_whitespace_pattern(options->whitespace); !s.ok()) {
    return field_error(field, "'" + field + "': " + s.message());
  }
  return std::nullopt;
}

template <typename Json>
const Json* member(const Json& object, const char* name) {
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

template <typename Json>
std::optional<StructuredOutputError> parse(const Json& body,
                                           std::optional<StructuredOutputRequest>* out) {
  using json = Json;
  out->reset();
  std::vector<Ask> asks;
  grammar::JsonRegexOptions json_options;
  if (auto e = whitespace_option(member(body, "guided_whitespace_pattern"),
                                 "guided_whitespace_pattern", &json_options)) {
    return e;
  }
  if (member(body, "guided_grammar") != nullptr) {
    return field_error("guided_grammar",
                       "'guided_grammar' is not supported (no grammar engine); use "
                       "guided_regex, guided_json or guided_choice",
                       true);
  }
  Ask ask;
  if (const json* v = member(body, "guided_json")) {
    if (auto e = schema_pattern(*v, "guided_json", json_options, &ask)) return e;
    asks.push_back(ask);
  }
  if (const json* v = member(body, "guided_regex")) {
    if (auto e = regex_pattern(*v, "guided_regex", &ask)) return e;
    asks.push_back(ask);
  }
  if (const json* v = member(body, "guided_choice")) {
    if (auto e = choice_pattern(*v, "guided_choice", &ask)) return e;
    asks.push_back(ask);
  }
  if (const json* so = member(body, "structured_outputs")) {
    const std::string f = "structured_outputs";
    if (!so->is_object()) return field_error(f, "'structured_outputs' must be an object");
    for (const char* unbuilt : {"grammar", "structural_tag"}) {
      if (member(*so, unbuilt)) {
        return field_error(f,
                           std::string("'structured_outputs.") + unbuilt +
                               "' is not supported; use json, regex, choice or json_object",
                           true);
      }
    }
    grammar::JsonRegexOptions options = json_options;
    if (auto e = whitespace_option(member(*so, "whitespace_pattern"), f, &options)) return e;
    if (const json* v = member(*so, "json")) {
      if (auto e = schema_pattern(*v, f, options, &ask)) return e;
      asks.push_back(ask);
    }
    if (const json* v = member(*so, "regex")) {
      if (auto e = regex_pattern(*v, f, &ask)) return e;
      asks.push_back(ask);
    }
    if (const json* v = member(*so, "choice")) {
      if (auto e = choice_pattern(*v, f, &ask)) return e;
      asks.push_back(ask);
    }
    if (const json* v = member(*so, "json_object")) {
      if (!v->is_boolean())
        return field_error(f, "'structured_outputs.json_object' must be a boolean");
      if (v->template get<bool>()) asks.push_back({f, grammar::json_object_regex(options)});
    }
  }
  if (const json* rf = member(body, "response_format")) {
    const std::string f = "response_format";
    const json* type = rf->is_object() ? member(*rf, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return field_error(f, "'response_format' must be an object with a string 'type'");
    }
    const std::string t = type->template get<std::string>();
    if (t == "json_object") {
      asks.push_back({f, grammar::json_object_regex(json_options)});
    } else if (t == "json_schema") {
      const json* js = member(*rf, "json_schema");
      if (js == nullptr || !js->is_object()) {
        return field_error(f, "'response_format' of type json_schema needs a 'json_schema' object");
      }
      if (const json* schema = member(*js, "schema")) {
        if (auto e = schema_pattern(*schema, f, json_options, &ask)) return e;
        asks.push_back(ask);
      } else {
        asks.push_back({f, grammar::json_object_regex(json_options)});
      }
    } else if (t != "text") {
      return field_error(f,
                         "'response_format' type '" + t +
                             "' is not supported; use text, json_object or json_schema",
                         true);
    }
  }
  if (asks.size() > 1) {
    return field_error(asks[1].field, "only one kind of structured output per request: '" +
                                          asks[0].field + "' and '" + asks[1].field +
                                          "' were both given");
  }
  if (!asks.empty()) *out = StructuredOutputRequest{asks[0].pattern, asks[0].field};
  return std::nullopt;
}

}  // namespace

std::optional<StructuredOutputError> parse_structured_output(
    const nlohmann::json& body, std::optional<StructuredOutputRequest>* out) {
  return parse(body, out);
}

std::optional<StructuredOutputError> parse_structured_output(
    const nlohmann::ordered_json& body, std::optional<StructuredOutputRequest>* out) {
  return parse(body, out);
}

StructuredOutputCompiler::StructuredOutputCompiler(const Tokenizer& tokenizer,
                                                   std::vector<TokenId> end_tokens,
                                                   size_t cache_entries)
    : tokenizer_(tokenizer), end_tokens_(std::move(end_tokens)), cache_entries_(cache_entries) {}

Result<std::shared_ptr<const grammar::TokenConstraint>> StructuredOutputCompiler::compile(
    const std::string& pattern) {
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
  {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(pattern); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    if (const auto it = refused_index_.find(pattern); it != refused_index_.end()) {
      refused_.splice(refused_.begin(), refused_, it->second);
      return it->second->second;
    }
    ++compilations_;
    if (!vocabulary_) {
      vocabulary_ = grammar::TokenVocabulary::build(
          tokenizer_.vocab_size(),
          [this](TokenId id) -> std::optional<std::string_view> {
            if (!tokenizer_.has_token(id) || tokenizer_.is_special(id)) return std::nullopt;
            return tokenizer_.token_bytes(id);
          },
          end_tokens_);
    }
    vocabulary = vocabulary_;
  }
  // Compiled outside the lock: a large schema takes a while, and other patterns need not wait.
  Result<std::shared_ptr<const grammar::RegexAutomaton>> automaton =
      grammar::RegexAutomaton::compile(pattern);
  std::lock_guard lock(mutex_);
  if (!automaton.ok()) {
    if (pattern.size() <= grammar::RegexLimits{}.max_pattern_bytes &&
        !refused_index_.contains(pattern)) {
      refused_.emplace_front(pattern, automaton.status());
      refused_index_.emplace(refused_.front().first, refused_.begin());
      while (refused_.size() > cache_entries_) {
        refused_index_.erase(refused_.back().first);
        refused_.pop_back();
      }
    }
    return automaton.status();
  }
  auto constraint = std::make_shared<const grammar::TokenConstraint>(std::move(automaton).value(),
                                                                     std::move(vocabulary));
  if (const auto it = index_.find(pattern); it != index_.end()) return it->second->second;
  lru_.emplace_front(pattern, constraint);
  index_.emplace(lru_.front().first, lru_.begin());
  while (lru_.size() > cache_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return constraint;
}

size_t StructuredOutputCompiler::compilations() const {
  std::lock_guard lock(mutex_);
  return compilations_;
}

}  // namespace peerserve
