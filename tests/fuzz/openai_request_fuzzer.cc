// libFuzzer target: arbitrary bytes as the body of /v1/chat/completions and
// /v1/completions, through the same steps as the server: the depth-checked JSON parse,
// request validation, then the shipped model's chat template and tokenizer. Every input
// must end in a request or an error (a 300,000-deep `tools` array once overflowed the stack).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "serve/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace {

const peerserve::Tokenizer* shipped_tokenizer() {
  static const std::unique_ptr<peerserve::Tokenizer> tokenizer = [] {
    auto loaded =
        peerserve::Tokenizer::load_from_dir(PEERSERVE_SOURCE_DIR "/models/peerserve-dsv3-tiny");
    if (!loaded.ok()) __builtin_trap();
    return std::make_unique<peerserve::Tokenizer>(std::move(loaded).value());
  }();
  return tokenizer.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const peerserve::Tokenizer* tokenizer = shipped_tokenizer();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const peerserve::ApiLimits limits;
  nlohmann::json json;
  if (peerserve::parse_json_body(body, limits, &json)) return 0;
  peerserve::CompletionRequest completion;
  if (!peerserve::parse_completion_request(json, limits, &completion)) {
    for (const auto& prompt : completion.prompts) {
      if (const auto* text = std::get_if<std::string>(&prompt)) {
        auto ids = tokenizer->encode(*text);
        (void)ids;
      }
    }
  }
  peerserve::ChatRequest chat;
  if (!peerserve::parse_chat_request(json, limits, &chat)) {
    peerserve::ChatTemplateInput input;
    input.messages = chat.messages;
    input.add_generation_prompt = chat.add_generation_prompt;
    input.extra_variables = chat.template_variables;
    auto ids = tokenizer->encode_chat(input);
    (void)ids;
  }
  return 0;
}
