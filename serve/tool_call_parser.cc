#include "serve/tool_call_parser.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "grammar/regex_automaton.h"

namespace peerserve {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```json";
constexpr std::string_view kArgumentsEnd = "```<｜tool▁call▁end｜>";
// A type or name longer than this without its delimiter is not a tool call.
constexpr size_t kMaxTypeBytes = 64;
constexpr size_t kMaxNameBytes = 256;
// Streamed arguments are checked to be a viable JSON prefix up to this size.
constexpr size_t kMaxCheckedBytes = 64 << 10;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(text.size(), marker.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// Records where the parser stopped; no values are kept.
class ErrorPosition : public nlohmann::json_sax<nlohmann::json> {
 public:
  size_t position = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception&) override {
    position = pos;
    return false;
  }
};

bool is_json_object(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '{') return false;
  return nlohmann::json::accept(text);
}

}  // namespace

bool is_viable_json_object_prefix(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return true;
  if (text[first] != '{') return false;
  // nlohmann's parser reports an error "after" the last byte (position > size) when the
  // input simply ran out; any other error is a byte that no continuation can fix. Its
  // SAX recursion is iterative, so deep nesting costs no stack.
  ErrorPosition sax;
  if (nlohmann::json::sax_parse(text, &sax)) return true;
  return sax.position > text.size();
}

ToolCallStreamParser::ToolCallStreamParser(int32_t max_calls) : max_calls_(max_calls) {}

bool ToolCallStreamParser::call_dropped() const {
  return max_calls_ > 0 && started_calls_ > max_calls_;
}

std::vector<ToolCallEvent> ToolCallStreamParser::feed(std::string_view text) {
  std::vector<ToolCallEvent> events;
  text_.append(text);
  advance(&events, /*at_end=*/false);
  return events;
}

std::vector<ToolCallEvent> ToolCallStreamParser::finish() {
  std::vector<ToolCallEvent> events;
  advance(&events, /*at_end=*/true);
  const bool incomplete = state_ == State::kType || state_ == State::kName ||
                          state_ == State::kFence || state_ == State::kArguments;
  if (incomplete) fail(&events);
  return events;
}

void ToolCallStreamParser::fail(std::vector<ToolCallEvent>* events) {
  if (call_dropped()) {
    // A call past the limit is not sent whatever it holds.
    state_ = State::kDone;
    pos_ = text_.size();
    return;
  }
  malformed_ = true;
  state_ = State::kContent;
  // What has not been sent as part of a call goes out as text.
  size_t from = call_start_;
  if (arguments_start_ > 0) {
    from = arguments_start_ + arguments_.size();
  } else if (header_sent_) {
    from = pos_;
  }
  if (from < text_.size()) {
    events->push_back({ToolCallEvent::Kind::kContent, 0, text_.substr(from)});
  }
  pos_ = text_.size();
}

void ToolCallStreamParser::advance(std::vector<ToolCallEvent>* events, bool at_end) {
  while (true) {
    const std::string_view rest = std::string_view(text_).substr(pos_);
    switch (state_) {
      case State::kContent: {
        const size_t begin = malformed_ ? std::string_view::npos : rest.find(kCallsBegin);
        size_t keep = begin;
        if (begin == std::string_view::npos) {
          keep = rest.size();
          if (!at_end && !malformed_) keep -= partial_marker_suffix(rest, kCallsBegin);
        }
        if (keep > 0) {
          events->push_back({ToolCallEvent::Kind::kContent, 0, std::string(rest.substr(0, keep))});
        }
        if (begin == std::string_view::npos) {
          pos_ += keep;
          return;
        }
        call_start_ = pos_ + begin;
        pos_ += begin + kCallsBegin.size();
        state_ = State::kBetweenCalls;
        continue;
      }
      case State::kBetweenCalls: {
        size_t skip = 0;
        while (skip < rest.size() && is_space(rest[skip])) ++skip;
        const std::string_view next = rest.substr(skip);
        if (next.starts_with(kCallBegin)) {
          if (complete_calls_ > 0) call_start_ = pos_ + skip;
          pos_ += skip + kCallBegin.size();
          ++started_calls_;
          header_sent_ = false;
          arguments_.clear();
          arguments_start_ = 0;
          state_ = State::kType;
          continue;
        }
        if (next.starts_with(kCallsEnd)) {
          pos_ = text_.size();  // what follows the block is not part of the answer
          state_ = State::kDone;
          return;
        }
        const bool may_continue = kCallBegin.starts_with(next) || kCallsEnd.starts_with(next);
        if (complete_calls_ > 0 && !may_continue) {
          // Text after complete calls without the closing marker: ignored, as after it.
          pos_ = text_.size();
          state_ = State::kDone;
          return;
        }
        if (complete_calls_ == 0 && (!may_continue || at_end)) fail(events);
        return;
      }
      case State::kType: {
        const size_t sep = rest.find(kSep);
        if (sep == std::string_view::npos) {
          if (rest.size() > kMaxTypeBytes + kSep.size()) fail(events);
          return;
        }
        if (rest.substr(0, sep) != "function") return fail(events);
        pos_ += sep + kSep.size();
        state_ = State::kName;
        continue;
      }
      case State::kName: {
        const size_t newline = rest.find('\n');
        if (newline == std::string_view::npos) {
          if (rest.size() > kMaxNameBytes + 1) fail(events);
          return;
        }
        std::string_view name = rest.substr(0, newline);
        while (!name.empty() && is_space(name.back())) name.remove_suffix(1);
        if (!valid_name(name)) return fail(events);
        name_ = std::string(name);
        if (!call_dropped()) {
          events->push_back({ToolCallEvent::Kind::kCallStart, started_calls_ - 1, name_});
          header_sent_ = true;
        }
        pos_ += newline + 1;
        state_ = State::kFence;
        continue;
      }
      case State::kFence: {
        size_t skip = 0;
        while (skip < rest.size() && (rest[skip] == ' ' || rest[skip] == '\t')) ++skip;
        const std::string_view next = rest.substr(skip);
        if (next.size() <= kFence.size()) {
          if (!kFence.starts_with(next)) fail(events);
          return;
        }
        if (!next.starts_with(kFence)) return fail(events);
        size_t after = kFence.size();
        while (after < next.size() &&
               (next[after] == ' ' || next[after] == '\t' || next[after] == '\r')) {
          ++after;
        }
        if (after == next.size()) return;
        if (next[after] != '\n') return fail(events);
        pos_ += skip + after + 1;
        arguments_start_ = pos_;
        state_ = State::kArguments;
        continue;
      }
      case State::kArguments: {
        // `rest` starts where the arguments sent so far end.
        const size_t end = rest.find(kArgumentsEnd);
        size_t sendable = end != std::string_view::npos
                              ? end
                              : rest.size() - partial_marker_suffix(rest, kArgumentsEnd);
        // Trailing whitespace may be the newline before the closing fence: held back.
        while (sendable > 0 && is_space(rest[sendable - 1])) --sendable;
        if (sendable > 0) {
          std::string candidate = arguments_ + std::string(rest.substr(0, sendable));
          // Re-parsing the whole prefix per fragment is quadratic; past kMaxCheckedBytes only
          // the final check below runs (arguments that large are rare).
          if (candidate.size() <= kMaxCheckedBytes && !is_viable_json_object_prefix(candidate)) {
            return fail(events);
          }
          arguments_ = std::move(candidate);
          if (!call_dropped()) {
            events->push_back({ToolCallEvent::Kind::kArguments, started_calls_ - 1,
                               std::string(rest.substr(0, sendable))});
          }
        }
        if (end == std::string_view::npos) {
          pos_ += sendable;
          return;
        }
        if (!is_json_object(arguments_)) return fail(events);
        if (!call_dropped()) calls_.push_back({name_, arguments_});
        ++complete_calls_;
        pos_ += end + kArgumentsEnd.size();
        arguments_start_ = 0;
        header_sent_ = false;
        state_ = State::kBetweenCalls;
        continue;
      }
      case State::kDone:
        pos_ = text_.size();
        return;
    }
  }
}

std::string forced_tool_call_prefix(const std::optional<std::string>& function_name) {
  std::string prefix =
      std::string(kCallsBegin) + std::string(kCallBegin) + "function" + std::string(kSep);
  if (function_name) prefix += *function_name + "\n" + std::string(kFence) + "\n";
  return prefix;
}

std::string forced_tool_call_pattern(std::span<const ToolArgumentsPattern> tools,
                                     const std::optional<std::string>& function_name,
                                     bool parallel) {
  using grammar::escape_regex;
  // The closing fence on a line of its own, as the model's template writes it.
  const std::string call_end = "\n" + escape_regex(kArgumentsEnd);
  if (function_name) {
    for (const ToolArgumentsPattern& tool : tools) {
      if (tool.name != *function_name) continue;
      return "(?:" + std::string(tool.arguments) + ")" + call_end + escape_regex(kCallsEnd);
    }
    return "";
  }
  // Tools with the same arguments pattern share one alternative, `(?:a|b)` then the arguments
  // once: the automaton then holds one copy of them, not one per tool (with a copy per tool,
  // 128 tools without parameters were over the automaton's bounds and left unconstrained).
  std::vector<std::pair<std::string_view, std::string>> groups;  // arguments, names
  std::unordered_map<std::string_view, size_t> group_of;         // by hash: they may be large
  for (const ToolArgumentsPattern& tool : tools) {
    const auto [group, added] = group_of.try_emplace(tool.arguments, groups.size());
    if (added) {
      groups.emplace_back(tool.arguments, escape_regex(tool.name));
    } else {
      groups[group->second].second += "|" + escape_regex(tool.name);
    }
  }
  std::string any_call = "(?:";
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) any_call += "|";
    any_call += "(?:" + groups[i].second + ")\n" + escape_regex(kFence) + "\n(?:";
    any_call += groups[i].first;
    any_call += ")";
  }
  any_call += ")" + call_end;
  // Further calls as (call, next call's start)* before the last call, not after the first:
  // the two copies of the call then run side by side in the automaton, in the same states,
  // where one after the other they made it twice as large (a call whose arguments are any
  // JSON object was over the automaton's bounds that way). DeepSeek-V3's template puts a
  // newline before each further call; the parser takes it or not.
  std::string pattern;
  if (parallel) {
    pattern = "(?:" + any_call + "\n?" + escape_regex(kCallBegin) + "function" +
              escape_regex(kSep) + ")*";
  }
  return pattern + any_call + escape_regex(kCallsEnd);
}

ParsedToolOutput parse_tool_calls(std::string_view text, int32_t max_calls) {
  ToolCallStreamParser parser(max_calls);
  std::string content;
  for (const auto& events : {parser.feed(text), parser.finish()}) {
    for (const ToolCallEvent& e : events) {
      if (e.kind == ToolCallEvent::Kind::kContent) content += e.text;
    }
  }
  ParsedToolOutput out;
  if (!parser.called_tools()) {
    out.content = std::string(text);
    return out;
  }
  if (!content.empty()) out.content = std::move(content);
  out.calls = parser.calls();
  return out;
}

}  // namespace peerserve
