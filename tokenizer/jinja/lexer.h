// Lexer for the Jinja subset of chat templates, with jinja2's whitespace rules as
// transformers configures them: trim_blocks (drop the first newline after a block or
// comment tag) and lstrip_blocks (drop spaces and tabs between a line start and a block
// or comment tag), plus the explicit "-" and "+" modifiers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve::jinja {

enum class TokenKind {
  kText,        // template data between tags (already whitespace-adjusted)
  kPrintBegin,  // {{
  kPrintEnd,    // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value already unescaped
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;
  size_t offset;  // into the template source, for error positions
};

// "line:column" (1-based) of a byte offset in `source`.
std::string position_text(std::string_view source, size_t offset);

// jinja2's source preparation: newlines ("\r\n", "\r") become "\n" and one trailing
// newline is dropped (keep_trailing_newline=False).
std::string normalize_template_source(std::string_view source);

// REQUIRES: source was normalized.
Result<std::vector<Token>> tokenize_template(std::string_view source);

}  // namespace peerserve::jinja
