// DeepSeek-V3's tool-call syntax in generated text, parsed into OpenAI tool calls.
//
// The model answers a tool call with its own (non-special) tokens:
//
//   [content]<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//   ```json
//   {"arg": ...}
//   ```<｜tool▁call▁end｜>
//   <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//
// (vLLM's deepseek_v3 parser reads the same). A well-formed call has type "function", a
// name of 1..256 bytes without control characters, and arguments that are one JSON object;
// the closing <｜tool▁calls▁end｜> may be missing (the answer stopped right after a complete
// call). Anything else is malformed: the whole output is then returned as plain text
// (non-streaming), never an error; except a call the server forced, answered as its stream
// went (serve/openai_server.cc).
//
// Streaming: the parser is fed the text deltas and returns what can be sent so far —
// content, a call's header once its name is complete, and argument fragments — holding
// back only text that could still turn into a marker. Arguments go out while they are a
// viable prefix of a JSON object (checked for the first 64 KiB of each call; beyond, only
// once the call ends); from the first malformed byte on, the raw remaining text
// goes out as content and called_tools() is false (the client then sees the engine's
// finish_reason, not "tool_calls", as with a call cut off by max_tokens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peerserve {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // the JSON object as the model wrote it
};

struct ParsedToolOutput {
  // Text before the calls; nullopt when there is none (OpenAI's content: null).
  std::optional<std::string> content;
  // Empty when the text holds no well-formed tool call (content is then the whole text).
  std::vector<ParsedToolCall> calls;
};

struct ToolCallEvent {
  enum class Kind {
    kContent,    // text: content
    kCallStart,  // index, text: the function name
    kArguments,  // index, text: the next fragment of the call's arguments
  };
  Kind kind = Kind::kContent;
  int32_t index = 0;
  std::string text;
};

class ToolCallStreamParser {
 public:
  // `max_calls`: calls after this many are dropped (parallel_tool_calls = false, a named
  // tool_choice); 0 = no limit.
  explicit ToolCallStreamParser(int32_t max_calls = 0);

  // Appends generated text; returns what can be sent now.
  std::vector<ToolCallEvent> feed(std::string_view text);
  // The output has ended: returns the held-back rest (a malformed or unterminated call's
  // raw text goes out as content).
  std::vector<ToolCallEvent> finish();

  // At least one complete, well-formed call and nothing malformed.
  bool called_tools() const { return !malformed_ && complete_calls_ > 0; }
  // The complete calls within max_calls so far (after finish(): all of them).
  const std::vector<ParsedToolCall>& calls() const { return calls_; }
  bool malformed() const { return malformed_; }

 private:
  enum class State { kContent, kBetweenCalls, kType, kName, kFence, kArguments, kDone };

  void advance(std::vector<ToolCallEvent>* events, bool at_end);
  void fail(std::vector<ToolCallEvent>* events);
  bool call_dropped() const;

  std::string text_;  // everything fed so far
  size_t pos_ = 0;    // first byte not yet consumed
  State state_ = State::kContent;
  bool malformed_ = false;
  int32_t max_calls_ = 0;
  int32_t started_calls_ = 0;
  int32_t complete_calls_ = 0;
  // Where the raw text of the current call begins (of the block, before the first call).
  size_t call_start_ = 0;
  bool header_sent_ = false;           // the current call's kCallStart went out
  std::string name_;                   // the current call's name
  std::string arguments_;              // the current call's arguments sent so far
  size_t arguments_start_ = 0;         // where they begin in text_ (0: not reached yet)
  std::vector<ParsedToolCall> calls_;  // complete calls within max_calls
};

// The text that starts a call in the model's syntax, appended to the prompt to force one:
// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>` (tool_choice
// "required": the model picks the function), followed by "NAME\n```json\n" when a
// function is named.
std::string forced_tool_call_prefix(const std::optional<std::string>& function_name);

// A function's name and a regular expression (grammar/regex_automaton.h syntax) for the
// arguments it accepts. Viewed, not owned: tools with the same schema share one copy.
struct ToolArgumentsPattern {
  std::string name;
  std::string_view arguments;
};

// A regular expression for what the model writes after forced_tool_call_prefix(function_name)
// to complete the forced call(s) in this syntax, ending with <｜tool▁calls▁end｜>: with a
// name, that function's arguments (the first entry of `tools` whose name it is; empty
// pattern if none is); without one, a call of any of `tools`, and more of them after it when
// `parallel`. Used as a structured-output constraint, so that a forced call parses and its
// arguments match the function's schema.
std::string forced_tool_call_pattern(std::span<const ToolArgumentsPattern> tools,
                                     const std::optional<std::string>& function_name,
                                     bool parallel);

// The whole output at once (non-streaming).
ParsedToolOutput parse_tool_calls(std::string_view text, int32_t max_calls = 0);

// Whether `text` can still be completed into one JSON object (an object already complete,
// followed by whitespace only, counts too).
bool is_viable_json_object_prefix(std::string_view text);

}  // namespace peerserve
