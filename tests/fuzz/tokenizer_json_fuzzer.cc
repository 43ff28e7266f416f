// libFuzzer target: arbitrary bytes as tokenizer.json (and, after a NUL byte, as
// tokenizer_config.json), as downloaded with a checkpoint. Loading must return a tokenizer
// or an error; a loaded tokenizer must encode and decode without crashing, and its ids
// must all be tokens.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  peerserve::TokenizerSources sources;
  sources.tokenizer_json = std::string(input.substr(0, split));
  if (split != std::string_view::npos) sources.tokenizer_config_json = input.substr(split + 1);
  auto tokenizer = peerserve::Tokenizer::from_sources(sources);
  if (!tokenizer.ok()) return 0;
  for (const char* text : {"", "hello world", "a\xff\xfe b", "\xe4\xb8\xad\xe6\x96\x87 12345"}) {
    auto ids = tokenizer->encode(text);
    if (!ids.ok()) continue;
    for (const peerserve::TokenId id : *ids) {
      if (!tokenizer->has_token(id)) __builtin_trap();
    }
    auto decoded = tokenizer->decode(*ids);
    (void)decoded;
  }
  peerserve::ChatTemplateInput chat;
  chat.messages = nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}});
  chat.add_generation_prompt = true;
  auto encoded_chat = tokenizer->encode_chat(chat);
  (void)encoded_chat;
  return 0;
}
