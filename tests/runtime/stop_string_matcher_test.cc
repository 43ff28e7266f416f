#include "runtime/stop_string_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace peerserve {
namespace {

// Streams `pieces` through a matcher and returns everything it emitted.
std::string stream(StopStringMatcher& m, const std::vector<std::string>& pieces,
                   std::optional<std::string>* matched) {
  std::string out;
  for (const std::string& p : pieces) {
    auto step = m.push(p);
    out += step.text;
    if (step.matched) {
      *matched = step.matched;
      return out;
    }
  }
  return out + m.flush();
}

TEST(StopStringMatcherTest, MatchAcrossPieces) {
  StopStringMatcher m({"Hello"}, false);
  std::optional<std::string> matched;
  EXPECT_EQ(stream(m, {"say He", "l", "lo world"}, &matched), "say ");
  EXPECT_EQ(matched, "Hello");
}

TEST(StopStringMatcherTest, HoldsBackOnlyPossiblePrefixes) {
  StopStringMatcher m({"abc"}, false);
  auto s1 = m.push("xxab");
  EXPECT_EQ(s1.text, "xx");
  auto s2 = m.push("x");
  EXPECT_EQ(s2.text, "abx");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcherTest, IncludeStop) {
  StopStringMatcher m({"\n\n"}, true);
  std::optional<std::string> matched;
  EXPECT_EQ(stream(m, {"line\n", "\nnext"}, &matched), "line\n\n");
  EXPECT_EQ(matched, "\n\n");
}

TEST(StopStringMatcherTest, FirstStopToCompleteWinsWhateverTheSplit) {
  for (auto pieces : {std::vector<std::string>{"ab", "cdef"}, {"abcdef"}, {"a", "b", "c", "def"}}) {
    StopStringMatcher m({"bcde", "cd"}, false);
    std::optional<std::string> matched;
    EXPECT_EQ(stream(m, pieces, &matched), "ab");
    EXPECT_EQ(matched, "cd");
  }
}

TEST(StopStringMatcherTest, Utf8StopStrings) {
  StopStringMatcher m({"停止"}, false);
  std::optional<std::string> matched;
  EXPECT_EQ(stream(m, {"好的", "停", "止了"}, &matched), "好的");
  EXPECT_EQ(matched, "停止");
}

TEST(StopStringMatcherTest, NoStopsPassesThrough) {
  StopStringMatcher m({""}, false);
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("abc").text, "abc");
}

// Context text (the first min_tokens tokens) can start a stop string but not end one, as in
// vLLM's detokenizer: "end" wholly inside the context is not a stop; "ab" + "c" is.
TEST(StopStringMatcherTest, ContextStartsButNeverEndsAStop) {
  StopStringMatcher m({"end", "abc"}, false);
  std::string out = m.push_context("the end, ab").text;
  auto s = m.push("c and the end");
  out += s.text;
  EXPECT_EQ(out, "the end, ");
  EXPECT_EQ(s.matched, "abc");

  // A held context that contains a whole stop string does not match it later either.
  StopStringMatcher n({"ab", "xabc"}, false);
  out = n.push_context("xab").text;
  EXPECT_EQ(out, "");
  s = n.push("d");
  EXPECT_FALSE(s.matched);
  EXPECT_EQ(out + s.text + n.flush(), "xabd");
  StopStringMatcher o({"ab", "xabc"}, true);
  out = o.push_context("xab").text;
  s = o.push("c");
  EXPECT_EQ(s.matched, "xabc");
  EXPECT_EQ(out + s.text, "xabc");
}

// A random text over a tiny alphabet (many partial matches), 1-3 random stop strings of
// 1-5 characters, and whether the stop string is kept.
struct RandomCase {
  std::string text;
  std::vector<std::string> stops;
  bool include = false;
};
RandomCase random_case(std::mt19937& rng) {
  const std::string alphabet = "aab";
  RandomCase c;
  const size_t len = rng() % 30;
  for (size_t i = 0; i < len; ++i) c.text += alphabet[rng() % alphabet.size()];
  const int num_stops = 1 + static_cast<int>(rng() % 3);
  for (int k = 0; k < num_stops; ++k) {
    std::string stop;
    const int slen = 1 + static_cast<int>(rng() % 5);
    for (int i = 0; i < slen; ++i) stop += alphabet[rng() % alphabet.size()];
    c.stops.push_back(stop);
  }
  c.include = rng() % 2;
  return c;
}

// The reference: the text cut before the first stop string to end after `context` bytes
// (the one of those that starts first: the longest), with it when `include`; and which.
std::pair<std::string, std::optional<std::string>> reference_cut(const RandomCase& c,
                                                                 size_t context) {
  size_t cut = std::string::npos;
  std::string first_stop;
  for (size_t end = context + 1; end <= c.text.size() && cut == std::string::npos; ++end) {
    for (const std::string& s : c.stops) {
      if (s.size() <= end && c.text.compare(end - s.size(), s.size(), s) == 0 &&
          (cut == std::string::npos || end - s.size() < cut)) {
        cut = end - s.size();
        first_stop = s;
      }
    }
  }
  if (cut == std::string::npos) return {c.text, std::nullopt};
  return {c.text.substr(0, cut) + (c.include ? first_stop : ""), first_stop};
}

// Random texts, stop sets and splits: the streamed output must equal the full text cut
// before its first stop string (found by looking at every end position of the whole text).
TEST(StopStringMatcherTest, RandomSplitsMatchWholeTextReference) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    const RandomCase c = random_case(rng);
    const auto [expected, first_stop] = reference_cut(c, 0);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < c.text.size();) {
      const size_t n = 1 + rng() % 4;
      pieces.push_back(c.text.substr(i, n));
      i += n;
    }
    StopStringMatcher m(c.stops, c.include);
    std::optional<std::string> matched;
    ASSERT_EQ(stream(m, pieces, &matched), expected) << "text=" << c.text;
    ASSERT_EQ(matched, first_stop) << "text=" << c.text;
  }
}

// The same with a context: the first `context` bytes arrive through push_context, and the
// reference is the first stop string to end after them (it may start inside them).
TEST(StopStringMatcherTest, RandomContextMatchesWholeTextReference) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    const RandomCase c = random_case(rng);
    const size_t context = c.text.empty() ? 0 : rng() % (c.text.size() + 1);
    const auto [expected, first_stop] = reference_cut(c, context);
    StopStringMatcher m(c.stops, c.include);
    std::string out;
    std::optional<std::string> matched;
    for (size_t i = 0; i < c.text.size() && !matched;) {
      // Pieces never straddle the context's end, as tokens never straddle min_tokens.
      const size_t limit = i < context ? context : c.text.size();
      const size_t n = std::min<size_t>(1 + rng() % 4, limit - i);
      const std::string piece = c.text.substr(i, n);
      StopStringMatcher::Step step = i < context ? m.push_context(piece) : m.push(piece);
      out += step.text;
      matched = step.matched;
      i += n;
    }
    if (!matched) out += m.flush();
    ASSERT_EQ(out, expected) << "text=" << c.text << " context=" << context;
    ASSERT_EQ(matched, first_stop) << "text=" << c.text;
  }
}

}  // namespace
}  // namespace peerserve
