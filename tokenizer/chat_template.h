// ChatTemplate: the Jinja subset that DeepSeek-V3/V2 chat templates (tokenizer_config.json
// "chat_template") use, rendered as transformers does: jinja2 with trim_blocks=True and
// lstrip_blocks=True, plus the global raise_exception(message).
//
// Supported: {{ }} output, {% set %} (including `set ns.attr = ...`), namespace(...),
// {% for x in xs %} (with loop.index/index0/first/last/length, `else`, tuple unpacking
// `for k, v in d.items()`), {% if/elif/else %}, {%- -%} whitespace control, {# #}
// comments, string/integer/float/bool/none literals, lists and dicts, + - * / // %,
// ~ concatenation, comparisons, and/or/not, `in`/`not in`, `x if c else y`, attribute
// and item access, slices, tests (defined, undefined, none, string, number, mapping,
// iterable, sequence, true, false, boolean, integer, float, odd, even, eq, ne), filters
// (length/count, string, trim, upper, lower, default/d, join, first, last, list, tojson,
// replace, capitalize, title, items, int, float, abs, round, reverse, sort, unique, safe)
// and the string/dict methods strip/lstrip/rstrip/split/startswith/endswith/upper/lower/
// replace/title/items/keys/values/get.
//
// Anything else fails at parse time (or at render time for unknown names that are
// called) with an error that names the construct and its line:column.
//
// Values are JSON (nlohmann::json): messages, tools and other variables come straight
// from the request. Template and variables are untrusted: the engine is a sandbox (checked
// int64 arithmetic, one nesting limit for every recursive construct, caps on value and
// output size and on the work of one render; tokenizer/jinja/limits.h), and breaking a
// limit is an error, never a crash. Thread-safety: render() is const and may run
// concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve {

// Objects keep their keys in the order they came (ordered_json), as Python dicts do for
// transformers: a template printing a request's tools with tojson shows them as sent (a
// nlohmann::json converts implicitly, its keys sorted).
struct ChatTemplateInput {
  // [{"role": "system"|"user"|"assistant"|"tool", "content": ..., "tool_calls": [...]}]
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = false;
  // transformers' continue_final_message: the text ends with the final message's content
  // (what the template writes after it, such as an end-of-turn token, is cut off), so the
  // model continues that message. Not with add_generation_prompt.
  bool continue_final_message = false;
  // Further template variables (e.g. "tools"); they may not override the ones above or
  // bos_token/eos_token.
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> parse(std::string_view source);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // `variables` must be a JSON object; its members are the template's global names.
  Result<std::string> render(const nlohmann::ordered_json& variables) const;

  // The template text as jinja2 sees it (newlines normalized, one trailing newline dropped).
  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
