// grammar/regex_automaton against Python's `re` (an independent implementation) on random
// patterns and strings, plus the refusals and limits.
#include "grammar/regex_automaton.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/tokenizer/reference_process.h"

namespace peerserve::grammar {
namespace {

using nlohmann::ordered_json;

std::shared_ptr<const RegexAutomaton> compile_ok(const std::string& pattern) {
  auto r = RegexAutomaton::compile(pattern);
  EXPECT_TRUE(r.ok()) << pattern << ": " << r.status().message();
  return r.ok() ? *r : nullptr;
}

TEST(RegexAutomatonTest, MatchesWholeStringsOnly) {
  const auto a = compile_ok("ab+c");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->matches("abc"));
  EXPECT_TRUE(a->matches("abbbc"));
  EXPECT_FALSE(a->matches("ac"));
  EXPECT_FALSE(a->matches("abcx"));
  EXPECT_FALSE(a->matches("xabc"));
  const int32_t s = a->walk(a->start(), "ab");
  ASSERT_NE(s, RegexAutomaton::kDead);
  EXPECT_FALSE(a->accepting(s));
  EXPECT_TRUE(a->can_continue(s));
  EXPECT_EQ(a->walk(a->start(), "abx"), RegexAutomaton::kDead);
}

TEST(RegexAutomatonTest, NegatedClassesMatchAnyScalarValueInUtf8) {
  const auto a = compile_ok("\"[^\"\\\\\\x00-\\x1f]*\"");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->matches("\"h\xC3\xA9llo \xE4\xB8\xAD \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(a->matches("\"a\"b\""));
  EXPECT_FALSE(a->matches("\"\n\""));
  EXPECT_FALSE(a->matches("\"\xC3\""));          // a truncated sequence
  EXPECT_FALSE(a->matches("\"\xED\xA0\x80\""));  // a surrogate
  EXPECT_FALSE(a->matches("\"\xC0\xAF\""));      // overlong
}

TEST(RegexAutomatonTest, DeadEndsArePruned) {
  // "a" then an empty class can never match: after "a" the automaton is dead.
  const auto b = compile_ok("b|a(?:[a]{2}[^\\s\\S])");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->step(b->start(), 'a'), RegexAutomaton::kDead);
  EXPECT_TRUE(b->matches("b"));
}

TEST(RegexAutomatonTest, RefusalsNameWhatIsWrong) {
  struct Case {
    const char* pattern;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"a(?=b)", "only (?:...) groups"},
           {"(a)\\1", "backreferences"},
           {"a**", "multiple repeat"},
           {"*a", "nothing to repeat"},
           {"a{2,1}", "m < n"},
           {"a{1001}", "over 1000"},
           {"(ab", "missing ')'"},
           {"ab)", "unbalanced ')'"},
           {"[ab", "unterminated character class"},
           {"[b-a]", "out of order"},
           {"a\\q", "unsupported escape"},
           {"a^b", "only supported at the start"},
           {"a$b", "only supported at the end"},
           {"\\b", "assertions"},
           {"[\\s\\S]{0}[^\\s\\S]", "matches no string"},
       }) {
    auto r = RegexAutomaton::compile(c.pattern);
    ASSERT_FALSE(r.ok()) << c.pattern;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos)
        << c.pattern << ": " << r.status().message();
  }
  std::string deep(300, '(');
  deep += "a" + std::string(300, ')');
  EXPECT_FALSE(RegexAutomaton::compile(deep).ok());
  // Counted repetition of counted repetition: bounded before memory runs out.
  auto big = RegexAutomaton::compile("(?:(?:(?:[a-z]{1000}){1000}){1000})");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too large"), std::string::npos);
  RegexLimits small;
  small.max_dfa_states = 8;
  auto many = RegexAutomaton::compile("[ab]*a[ab]{5}", small);  // needs 2^6 DFA states
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("more than 8 states"), std::string::npos);
}

TEST(RegexAutomatonTest, EscapeRegexMatchesTheTextOnly) {
  const std::string text = "a.b*c+(d)[e]{f}|g^h$i\\j-k/l?";
  const auto a = compile_ok(escape_regex(text));
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->matches(text));
  EXPECT_FALSE(a->matches("a.b*c+(d)[e]{f}|g^h$i\\j-k/l"));
}

// Random patterns over a small alphabet with 1-, 2-, 3- and 4-byte characters, each with
// strings it matches (generated from the pattern) and random strings.
class PatternMaker {
 public:
  explicit PatternMaker(uint32_t seed) : rng_(seed) {}

  // Returns a pattern; `sample` gets one string it matches.
  std::string make(int depth, std::string& sample) {
    const int kind = pick(depth <= 0 ? 5 : 9);
    switch (kind) {
      case 0:
      case 1: {
        const std::string c = chars_[pick(static_cast<int>(chars_.size()))];
        sample += c;
        return c == "." ? "\\." : c;
      }
      case 2: {  // a class, maybe negated
        const bool negated = pick(3) == 0;
        std::string members;
        std::vector<std::string> in;
        const int n = 1 + pick(3);
        for (int i = 0; i < n; ++i) {
          const std::string c = chars_[pick(static_cast<int>(chars_.size()))];
          in.push_back(c);
          members += c == "." ? "." : c;
        }
        if (pick(2) == 0) {
          members += "x-z";
          in.push_back("y");
        }
        if (negated) {
          sample += "\xE2\x82\xAC";  // a character the alphabet never lists: a euro sign
          return "[^" + members + "]";
        }
        sample += in[static_cast<size_t>(pick(static_cast<int>(in.size())))];
        return "[" + members + "]";
      }
      case 3: {
        static const std::vector<std::pair<std::string, std::string>> kClasses = {
            {"\\d", "7"}, {"\\w", "q"}, {"\\s", " "},     {"\\D", "a"},
            {"\\W", "-"}, {"\\S", "b"}, {".", "\xC3\xA9"}};
        const auto& [p, s] = kClasses[static_cast<size_t>(pick(static_cast<int>(kClasses.size())))];
        sample += s;
        return p;
      }
      case 4:
        return "";
      case 5:
      case 6: {  // concatenation
        std::string p;
        const int n = 2 + pick(2);
        for (int i = 0; i < n; ++i) p += wrap(make(depth - 1, sample));
        return p;
      }
      case 7: {  // alternation
        const int n = 2 + pick(2);
        const int chosen = pick(n);
        std::string p = "(?:";
        for (int i = 0; i < n; ++i) {
          std::string s;
          p += (i ? "|" : "") + make(depth - 1, s);
          if (i == chosen) sample += s;
        }
        return p + ")";
      }
      default: {  // repetition
        static const std::vector<std::tuple<std::string, int, int>> kQuant = {
            {"*", 0, 3},     {"+", 1, 3},    {"?", 0, 1}, {"{2}", 2, 2},
            {"{0,2}", 0, 2}, {"{1,}", 1, 3}, {"*?", 0, 2}};
        const auto& [q, lo, hi] =
            kQuant[static_cast<size_t>(pick(static_cast<int>(kQuant.size())))];
        std::string body_sample;
        const std::string body = make(depth - 1, body_sample);
        const int times = lo + pick(hi - lo + 1);
        for (int i = 0; i < times; ++i) sample += body_sample;
        return "(?:" + body + ")" + q;
      }
    }
  }

  std::string random_string() {
    std::string s;
    const int n = pick(7);
    for (int i = 0; i < n; ++i) {
      const int k = pick(static_cast<int>(chars_.size()) + 4);
      s += k < static_cast<int>(chars_.size())        ? chars_[static_cast<size_t>(k)]
           : k == static_cast<int>(chars_.size())     ? "7"
           : k == static_cast<int>(chars_.size()) + 1 ? " "
           : k == static_cast<int>(chars_.size()) + 2 ? "\xE2\x82\xAC"
                                                      : "\n";
    }
    return s;
  }

  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

 private:
  static std::string wrap(const std::string& p) { return "(?:" + p + ")"; }
  std::mt19937 rng_;
  const std::vector<std::string> chars_ = {
      "a", "b", "c", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "."};
};

TEST(RegexAutomatonTest, AgreesWithPythonReOnRandomPatterns) {
  PatternMaker maker(20261130);
  ordered_json request;
  request["cases"] = ordered_json::array();
  std::vector<std::shared_ptr<const RegexAutomaton>> compiled;
  std::vector<std::vector<std::string>> strings;
  for (int i = 0; i < 400; ++i) {
    std::vector<std::string> s;
    std::string positive;
    const std::string pattern = maker.make(3, positive);
    s.push_back(positive);
    for (int j = 0; j < 12; ++j) s.push_back(maker.random_string());
    // Prefixes and extensions of the positive: the boundary cases of a full match.
    if (!positive.empty()) {  // without its last character (not its last byte)
      size_t cut = positive.size() - 1;
      while (cut > 0 && (static_cast<uint8_t>(positive[cut]) & 0xC0) == 0x80) --cut;
      s.push_back(positive.substr(0, cut));
    }
    s.push_back(positive + "a");
    auto a = RegexAutomaton::compile(pattern);
    ASSERT_TRUE(a.ok()) << pattern << ": " << a.status().message();
    compiled.push_back(*a);
    strings.push_back(s);
    request["cases"].push_back({{"pattern", pattern}, {"strings", s}});
  }
  std::string error;
  const std::string command =
      "/usr/bin/python3 " +
      testing::shell_quote((testing::source_dir() / "tests/grammar/regex_reference.py").string());
  const auto response = testing::run_json_tool(command, request, error);
  ASSERT_TRUE(response) << error;
  const auto& results = (*response)["results"];
  ASSERT_EQ(results.size(), compiled.size());
  int positives = 0, checked = 0;
  for (size_t i = 0; i < compiled.size(); ++i) {
    const std::string pattern = request["cases"][i]["pattern"];
    ASSERT_TRUE(results[i].is_array()) << pattern << ": " << results[i].dump();
    for (size_t j = 0; j < strings[i].size(); ++j) {
      const bool expected = results[i][j].get<bool>();
      EXPECT_EQ(compiled[i]->matches(strings[i][j]), expected)
          << "pattern " << pattern << " string \"" << strings[i][j] << "\"";
      positives += expected;
      ++checked;
    }
    EXPECT_TRUE(results[i][0].get<bool>()) << "the generated sample must match: " << pattern;
  }
  // Both outcomes are exercised in quantity.
  EXPECT_GT(positives, checked / 10);
  EXPECT_LT(positives, checked * 9 / 10);
}

}  // namespace
}  // namespace peerserve::grammar
