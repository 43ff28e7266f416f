// The DeepSeek-V3 tool-call parser: whole outputs, every way of splitting them into stream
// deltas, malformed outputs (returned as text), and random bytes (never a crash, and the
// streamed pieces always add up to the input or to well-formed calls).
#include "serve/tool_call_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/regex_automaton.h"

namespace peerserve {
namespace {

const std::string kCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kCallBegin = "<｜tool▁call▁begin｜>";
const std::string kCallEnd = "<｜tool▁call▁end｜>";
const std::string kSep = "<｜tool▁sep｜>";

std::string call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}

// What a client assembles from the events of a stream.
struct Assembled {
  std::string content;
  std::vector<std::string> names;
  std::vector<std::string> arguments;
  bool called = false;
};

Assembled run_stream(const std::string& text, const std::vector<size_t>& cuts,
                     int32_t max_calls = 0) {
  ToolCallStreamParser parser(max_calls);
  Assembled out;
  auto take = [&](const std::vector<ToolCallEvent>& events) {
    for (const ToolCallEvent& e : events) {
      switch (e.kind) {
        case ToolCallEvent::Kind::kContent:
          out.content += e.text;
          break;
        case ToolCallEvent::Kind::kCallStart:
          ASSERT_EQ(e.index, static_cast<int32_t>(out.names.size()));
          out.names.push_back(e.text);
          out.arguments.emplace_back();
          break;
        case ToolCallEvent::Kind::kArguments:
          ASSERT_EQ(e.index + 1, static_cast<int32_t>(out.names.size()));
          out.arguments.back() += e.text;
          break;
      }
    }
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(parser.feed(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  take(parser.feed(std::string_view(text).substr(at)));
  take(parser.finish());
  out.called = parser.called_tools();
  return out;
}

Assembled run_bytewise(const std::string& text, int32_t max_calls = 0) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
  return run_stream(text, cuts, max_calls);
}

TEST(ToolCallParser, PlainTextIsContent) {
  const std::string text = "The weather is fine. <｜tool not a marker";
  ParsedToolOutput out = parse_tool_calls(text);
  ASSERT_TRUE(out.content);
  EXPECT_EQ(*out.content, text);
  EXPECT_TRUE(out.calls.empty());
  Assembled a = run_bytewise(text);
  EXPECT_EQ(a.content, text);
  EXPECT_FALSE(a.called);
}

TEST(ToolCallParser, OneCallWithContentBefore) {
  const std::string args = R"({"location": "Tokyo", "unit": "celsius"})";
  const std::string text = "Let me check." + kCallsBegin + call("get_weather", args) + kCallsEnd;
  ParsedToolOutput out = parse_tool_calls(text);
  ASSERT_TRUE(out.content);
  EXPECT_EQ(*out.content, "Let me check.");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, args);

  Assembled a = run_bytewise(text);
  EXPECT_TRUE(a.called);
  EXPECT_EQ(a.content, "Let me check.");
  ASSERT_EQ(a.names.size(), 1u);
  EXPECT_EQ(a.names[0], "get_weather");
  EXPECT_EQ(a.arguments[0], args);
}

TEST(ToolCallParser, NoContentGivesNull) {
  const std::string text = kCallsBegin + call("f", "{}") + kCallsEnd;
  ParsedToolOutput out = parse_tool_calls(text);
  EXPECT_FALSE(out.content);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{}");
}

TEST(ToolCallParser, SeveralCallsAndMissingClosingMarker) {
  const std::string text = kCallsBegin + call("a", R"({"x": [1, 2, {"y": "```"}]})") + "\n" +
                           call("b_2", "{\n  \"s\": \"\\u00e9\"\n}");
  ParsedToolOutput out = parse_tool_calls(text);
  ASSERT_EQ(out.calls.size(), 2u) << out.content.value_or("");
  EXPECT_EQ(out.calls[0].name, "a");
  EXPECT_EQ(out.calls[0].arguments, R"({"x": [1, 2, {"y": "```"}]})");
  EXPECT_EQ(out.calls[1].name, "b_2");
  EXPECT_EQ(out.calls[1].arguments, "{\n  \"s\": \"\\u00e9\"\n}");
  Assembled a = run_bytewise(text);
  EXPECT_TRUE(a.called);
  EXPECT_EQ(a.names, (std::vector<std::string>{"a", "b_2"}));
  EXPECT_EQ(a.arguments[1], out.calls[1].arguments);
}

TEST(ToolCallParser, MaxCallsDropsTheRest) {
  const std::string text = kCallsBegin + call("a", "{}") + call("b", "{}") + kCallsEnd;
  ParsedToolOutput out = parse_tool_calls(text, 1);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "a");
  Assembled a = run_bytewise(text, 1);
  EXPECT_TRUE(a.called);
  EXPECT_EQ(a.names, (std::vector<std::string>{"a"}));
  // A malformed call past the limit does not spoil the first.
  const std::string bad_second = kCallsBegin + call("a", "{}") + kCallBegin + "function" + kSep;
  EXPECT_EQ(parse_tool_calls(bad_second, 1).calls.size(), 1u);
  EXPECT_TRUE(run_bytewise(bad_second, 1).called);
}

TEST(ToolCallParser, MalformedOutputsAreText) {
  const std::vector<std::string> bad = {
      kCallsBegin,                                                          // nothing follows
      kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{\"a\"",  // unterminated
      kCallsBegin + call("f", R"({"a": x})"),                               // bad JSON
      kCallsBegin + call("f", "[1, 2]"),                                    // not an object
      kCallsBegin + call("f", R"({"a": 1)"),                                // object not closed
      kCallsBegin + kCallBegin + "python" + kSep + "f\n```json\n{}\n```" + kCallEnd,
      kCallsBegin + call("", "{}"),                                            // no name
      kCallsBegin + kCallBegin + "function" + kSep + "f\n{}\n```" + kCallEnd,  // no fence
      kCallsBegin + "hello" + call("f", "{}"),  // junk before the call
      "text " + kCallsBegin + kCallBegin + "function" + kSep + std::string(300, 'n'),
  };
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    ParsedToolOutput out = parse_tool_calls(text);
    EXPECT_TRUE(out.calls.empty());
    ASSERT_TRUE(out.content);
    EXPECT_EQ(*out.content, text);
    Assembled a = run_bytewise(text);
    EXPECT_FALSE(a.called);
    // Streamed: what went out as a call plus what went out as text covers the input.
    for (const std::string& args : a.arguments) {
      EXPECT_TRUE(is_viable_json_object_prefix(args)) << args;
    }
  }
}

TEST(ToolCallParser, ViableJsonPrefixes) {
  const std::string object = R"({"a": [1, -2.5e3, true, null, "x\"y\u00e9"], "b": {}})";
  for (size_t n = 0; n <= object.size(); ++n) {
    EXPECT_TRUE(is_viable_json_object_prefix(object.substr(0, n))) << object.substr(0, n);
  }
  EXPECT_TRUE(is_viable_json_object_prefix(object + "  \n"));
  for (const char* bad : {"[", "1", "\"s\"", "{x", "{\"a\": x", "{\"a\": 1}}", "{\"a\": 1} x",
                          "{\"a\": tx", "{\"a\": \"\\q\"}"}) {
    EXPECT_FALSE(is_viable_json_object_prefix(bad)) << bad;
  }
  // Deep nesting is checked without recursion.
  EXPECT_TRUE(
      is_viable_json_object_prefix(std::string(1, '{') + "\"a\":" + std::string(100000, '[')));
}

// Any split of a well-formed text into deltas gives what feeding it whole gives (of a
// malformed one, how much of the bad call's arguments went out before the bad byte depends
// on the split; it is never a call).
TEST(ToolCallParser, SplitsDoNotMatter) {
  const std::vector<std::string> texts = {
      "Hi." + kCallsBegin + call("get_weather", R"({"city": "Paris", "days": [1, 2]})") +
          call("time", "{}") + kCallsEnd,
      "a<｜tool▁calls" + std::string("x") + kCallsBegin + call("f", "{\"k\": \"v\"}"),
      kCallsBegin + call("f", R"({"a": x})") + kCallsEnd,
      "no calls at all <｜",
  };
  std::mt19937 rng(7);
  for (const std::string& text : texts) {
    const Assembled whole = run_stream(text, {});
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < text.size(); ++i) {
        if (rng() % 5 == 0) cuts.push_back(i);
      }
      const Assembled split = run_stream(text, cuts);
      EXPECT_EQ(split.called, whole.called);
      if (!whole.called) continue;
      EXPECT_EQ(split.content, whole.content);
      EXPECT_EQ(split.names, whole.names);
      EXPECT_EQ(split.arguments, whole.arguments);
      EXPECT_EQ(split.called, whole.called);
    }
  }
}

// Random mutations of a well-formed answer: no crash; a stream either calls tools with
// arguments that are JSON objects, or is flagged as not calling them.
TEST(ToolCallParser, RandomMutations) {
  const std::string base =
      "ok" + kCallsBegin + call("f", R"({"a": [1, {"b": "c"}]})") + call("g", "{}") + kCallsEnd;
  std::mt19937 rng(11);
  const std::string alphabet = "{}[]\":,` \nafunction<｜>▁";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (text.size() + 1);
      switch (rng() % 3) {
        case 0:
          if (at < text.size()) text.erase(at, 1 + rng() % 3);
          break;
        case 1:
          text.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          if (at < text.size()) text[at] = static_cast<char>(rng() % 256);
      }
    }
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 3 == 0) cuts.push_back(i);
    }
    const Assembled a = run_stream(text, cuts);
    const ParsedToolOutput whole = parse_tool_calls(text);
    EXPECT_EQ(a.called, !whole.calls.empty()) << text;
    if (a.called) {
      ASSERT_EQ(a.arguments.size(), whole.calls.size());
      for (size_t i = 0; i < whole.calls.size(); ++i) {
        EXPECT_EQ(a.arguments[i], whole.calls[i].arguments);
        EXPECT_TRUE(nlohmann::json::accept(whole.calls[i].arguments)) << whole.calls[i].arguments;
      }
    } else {
      EXPECT_EQ(whole.content.value_or(""), text);
    }
  }
}

// The pattern that constrains a forced call accepts the texts the parser reads as that call
// (the parser is the independent judge here) and nothing past the call's end.
TEST(ForcedToolCallPattern, AcceptsWhatTheParserReadsAsTheCall) {
  const std::vector<ToolArgumentsPattern> tools = {
      {"get_weather", R"re(\{"city": "[A-Za-z]{1,8}"\})re"},
      {"get_time", R"re(\{"zone": "(UTC|CET)"\})re"}};
  auto automaton = [](const std::string& pattern) {
    auto compiled = grammar::RegexAutomaton::compile(pattern);
    EXPECT_TRUE(compiled.ok()) << pattern;
    return std::move(compiled).value();
  };
  const std::string end = "\n```" + kCallEnd + kCallsEnd;

  // Named: the arguments, then the closing markers.
  const auto named = automaton(forced_tool_call_pattern(tools, "get_time", true));
  const std::string named_text = R"({"zone": "CET"})" + end;
  EXPECT_TRUE(named->matches(named_text));
  ParsedToolOutput parsed = parse_tool_calls(forced_tool_call_prefix("get_time") + named_text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_time");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"zone": "CET"})");
  EXPECT_FALSE(named->matches(R"({"zone": "PST"})" + end));   // outside the schema
  EXPECT_FALSE(named->matches(R"({"city": "Oslo"})" + end));  // another tool's arguments
  EXPECT_FALSE(named->matches(R"({"zone": "CET"})"));         // no closing markers
  EXPECT_FALSE(named->matches(named_text + "more"));          // text after the block
  EXPECT_EQ(forced_tool_call_pattern(tools, "no_such_tool", true), "");

  // "required": any tool, by name; more calls only when parallel.
  const std::string first =
      "get_weather\n```json\n" + std::string(R"({"city": "Oslo"})") + "\n```" + kCallEnd;
  const std::string second = call("get_time", R"({"zone": "UTC"})");
  const auto parallel = automaton(forced_tool_call_pattern(tools, std::nullopt, true));
  const auto single = automaton(forced_tool_call_pattern(tools, std::nullopt, false));
  // DeepSeek-V3's template writes a newline before every call after the first; the parser
  // reads it with or without.
  for (const std::string& text :
       {first + kCallsEnd, first + second + kCallsEnd, first + "\n" + second + kCallsEnd}) {
    EXPECT_TRUE(parallel->matches(text)) << text;
    parsed = parse_tool_calls(forced_tool_call_prefix(std::nullopt) + text);
    EXPECT_EQ(parsed.calls.size(), text.size() > first.size() + kCallsEnd.size() ? 2u : 1u);
    EXPECT_EQ(parsed.calls[0].name, "get_weather");
    EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "Oslo"})");
  }
  EXPECT_TRUE(single->matches(first + kCallsEnd));
  EXPECT_FALSE(single->matches(first + second + kCallsEnd));
  EXPECT_FALSE(single->matches(first + "\n" + second + kCallsEnd));
  EXPECT_FALSE(parallel->matches(first + "\n\n" + second + kCallsEnd));
  EXPECT_FALSE(parallel->matches("get_date\n```json\n{}\n```" + kCallEnd + kCallsEnd));

  // Tools with the same arguments share one alternative; each name still takes only them.
  const std::vector<ToolArgumentsPattern> shared = {
      {"a", R"(\{\})"}, {"b", R"re(\{"x": 1\})re"}, {"c", R"(\{\})"}};
  const std::string grouped = forced_tool_call_pattern(shared, std::nullopt, false);
  EXPECT_EQ(grouped.find(R"(\{\})"), grouped.rfind(R"(\{\})")) << grouped;
  const auto any = automaton(grouped);
  auto one_call = [&](const std::string& name, const std::string& args) {
    return name + "\n```json\n" + args + "\n```" + kCallEnd + kCallsEnd;
  };
  EXPECT_TRUE(any->matches(one_call("a", "{}")));
  EXPECT_TRUE(any->matches(one_call("c", "{}")));
  EXPECT_TRUE(any->matches(one_call("b", R"({"x": 1})")));
  EXPECT_FALSE(any->matches(one_call("b", "{}")));
  EXPECT_FALSE(any->matches(one_call("c", R"({"x": 1})")));
}

}  // namespace
}  // namespace peerserve
