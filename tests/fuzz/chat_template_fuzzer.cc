// libFuzzer target: a chat template and its messages, both untrusted (the template comes
// with a downloaded checkpoint, the messages from a client). Input: the template text, then
// optionally a NUL byte and the messages as JSON. Parsing and rendering must return a
// result or an error: no crash, no undefined behaviour, no runaway time or memory (the
// budgets are lowered so that one input stays fast).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string source = peerserve::jinja::normalize_template_source(input.substr(0, split));
  const std::string_view messages = split == std::string_view::npos
                                        ? std::string_view(R"([{"role": "user", "content": "hi"}])")
                                        : input.substr(split + 1);
  auto tokens = peerserve::jinja::tokenize_template(source);
  if (!tokens.ok()) return 0;
  auto nodes = peerserve::jinja::parse_template(source, *tokens);
  if (!nodes.ok()) return 0;
  // Parsed as one text (no deep copy of the messages, which would recurse).
  const std::string variables_text =
      R"({"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
          "messages": )" +
      std::string(messages) + "}";
  const nlohmann::json variables =
      nlohmann::json::parse(variables_text, nullptr, /*allow_exceptions=*/false);
  if (variables.is_discarded()) return 0;
  peerserve::jinja::RenderLimits limits;
  limits.max_value_bytes = 1 << 20;
  limits.max_output_bytes = 1 << 20;
  limits.max_list_items = 100000;
  limits.max_steps = 300000;
  limits.max_computed_bytes = 64 << 20;
  auto rendered = peerserve::jinja::render_template(source, *nodes, variables, limits);
  if (rendered.ok() && rendered->size() > limits.max_output_bytes) __builtin_trap();
  return 0;
}
