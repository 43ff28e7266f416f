// Parser for the Jinja subset (see tokenizer/chat_template.h): tokens -> syntax tree.
// Unsupported statements, filters, tests, functions and methods are rejected here, with
// the construct's name and line:column.
#pragma once

#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace peerserve::jinja {

Result<NodeList> parse_template(std::string_view source, const std::vector<Token>& tokens);

}  // namespace peerserve::jinja
