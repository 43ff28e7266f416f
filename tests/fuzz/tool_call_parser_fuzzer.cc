// libFuzzer target: arbitrary text as model output through the DeepSeek-V3 tool-call parser,
// whole and as a stream cut every N bytes (N from the first input byte). Traps when the two
// disagree on whether tools were called, or when a reported call's arguments are not JSON.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/tool_call_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t stride = 1 + data[0] % 16;
  const int32_t max_calls = data[0] / 128;  // 0 (no limit) or 1
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const peerserve::ParsedToolOutput whole = peerserve::parse_tool_calls(text, max_calls);
  peerserve::ToolCallStreamParser stream(max_calls);
  for (size_t at = 0; at < text.size(); at += stride) stream.feed(text.substr(at, stride));
  stream.finish();
  if (stream.called_tools() != !whole.calls.empty()) __builtin_trap();
  for (const peerserve::ParsedToolCall& call : whole.calls) {
    if (!nlohmann::json::accept(call.arguments)) __builtin_trap();
  }
  if (whole.calls.empty() && whole.content != std::string(text)) __builtin_trap();
  return 0;
}
