// grammar/token_constraint: the trie walk's masks against a plain per-token walk, on a
// synthetic vocabulary and on DeepSeek-V3's 129k-token one; generation under a constraint
// stays inside the language and ends only on a whole match.
#include "grammar/token_constraint.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "tests/tokenizer/reference_process.h"
#include "tokenizer/tokenizer.h"

namespace peerserve::grammar {
namespace {

std::shared_ptr<const RegexAutomaton> compile(const std::string& pattern) {
  auto r = RegexAutomaton::compile(pattern);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : nullptr;
}

// The plain reference: a token is allowed when its bytes keep the automaton alive; the end
// tokens when the state accepts or nothing else is allowed.
std::set<TokenId> plain_allowed(const RegexAutomaton& a, const TokenVocabulary& v, int32_t state) {
  std::set<TokenId> out;
  if (state != RegexAutomaton::kDead) {
    for (TokenId id = 0; id < v.vocab_size(); ++id) {
      const std::string_view b = v.token_bytes(id);
      if (!b.empty() && a.walk(state, b) != RegexAutomaton::kDead) out.insert(id);
    }
  }
  if (state == RegexAutomaton::kDead || a.accepting(state) || out.empty()) {
    out.insert(v.end_tokens().begin(), v.end_tokens().end());
  }
  return out;
}

std::set<TokenId> mask_set(const TokenConstraint& c, int32_t state) {
  std::set<TokenId> out;
  const std::vector<uint64_t>& bits = c.allowed(state);
  for (TokenId id = 0; id < c.vocabulary().vocab_size(); ++id) {
    if ((bits[static_cast<size_t>(id) / 64] >> (id % 64)) & 1u) out.insert(id);
  }
  return out;
}

// Every state reachable from the start by tokens (breadth first, at most `limit`), each
// compared with the plain reference.
void expect_masks_match_plain(const TokenConstraint& c, size_t limit) {
  std::set<int32_t> seen = {c.automaton().start()};
  std::deque<int32_t> queue = {c.automaton().start()};
  while (!queue.empty() && seen.size() <= limit) {
    const int32_t s = queue.front();
    queue.pop_front();
    const std::set<TokenId> expected = plain_allowed(c.automaton(), c.vocabulary(), s);
    ASSERT_EQ(mask_set(c, s), expected) << "state " << s;
    for (const TokenId id : expected) {
      const int32_t next = c.advance(s, id);
      if (next != RegexAutomaton::kDead && seen.insert(next).second) queue.push_back(next);
    }
  }
}

std::shared_ptr<const TokenVocabulary> small_vocabulary() {
  // Id 3 is special (no text), id 11 is EOS, id 12 is a hole.
  static const std::vector<std::string> kTokens = {
      "{",  "}",     "\"", "",      "a", "ab",       "abc",  ":",    " ", "1",
      "12", "<eos>", "",   "\"a\"", "x", "\xC3\xA9", "\xC3", "\xA9", "0", ", "};
  return TokenVocabulary::build(static_cast<int32_t>(kTokens.size()),
                                [](TokenId id) -> std::optional<std::string_view> {
                                  if (id == 3 || id == 11 || id == 12) return std::nullopt;
                                  return std::string_view(kTokens[static_cast<size_t>(id)]);
                                },
                                {11});
}

TEST(TokenVocabularyTest, TrieHoldsEveryTextTokenOnce) {
  const auto v = small_vocabulary();
  std::multiset<TokenId> found;
  for (size_t node = 0; node < v->num_nodes(); ++node) {
    for (const TokenId id : v->tokens_at(node)) found.insert(id);
    EXPECT_LE(v->subtree_end(node), v->num_nodes());
    EXPECT_GT(v->subtree_end(node), node);
  }
  std::multiset<TokenId> expected;
  for (TokenId id = 0; id < v->vocab_size(); ++id) {
    if (!v->token_bytes(id).empty()) expected.insert(id);
  }
  EXPECT_EQ(found, expected);
  EXPECT_EQ(v->token_bytes(11), "");
  EXPECT_EQ(v->token_bytes(99), "");
}

TEST(TokenConstraintTest, MasksEqualThePlainWalkOnASmallVocabulary) {
  for (const char* pattern : {"\\{\"a\": ?(?:0|[1-9][0-9]*)(?:, \"a\": ?[0-9]+)*\\}",
                              "(?:ab|abc|x)+", "\\u00e9+", "[^a]{0,3}", "abcx"}) {
    SCOPED_TRACE(pattern);
    const auto a = compile(pattern);
    ASSERT_TRUE(a);
    const TokenConstraint c(a, small_vocabulary());
    expect_masks_match_plain(c, 200);
  }
}

TEST(TokenConstraintTest, EndTokensOnlyWhenWholeOrStuck) {
  const auto v = small_vocabulary();
  // "xy" cannot be spelled: no token holds 'y'. After "x" nothing fits: EOS is the way out.
  const TokenConstraint stuck(compile("xy"), v);
  const int32_t after_x = stuck.state_after(std::vector<TokenId>{14});
  ASSERT_NE(after_x, RegexAutomaton::kDead);
  EXPECT_EQ(mask_set(stuck, after_x), std::set<TokenId>{11});
  const TokenConstraint ab(compile("ab(?:c)?"), v);
  EXPECT_EQ(mask_set(ab, ab.automaton().start()), (std::set<TokenId>{4, 5, 6}));
  EXPECT_EQ(mask_set(ab, ab.state_after(std::vector<TokenId>{5})), std::set<TokenId>{11});
  EXPECT_EQ(mask_set(ab, ab.state_after(std::vector<TokenId>{6})), std::set<TokenId>{11});
  // An end token, or a token outside the language, leaves it: only the end tokens remain.
  EXPECT_EQ(ab.state_after(std::vector<TokenId>{5, 11}), RegexAutomaton::kDead);
  EXPECT_EQ(ab.state_after(std::vector<TokenId>{14}), RegexAutomaton::kDead);
  EXPECT_EQ(mask_set(ab, RegexAutomaton::kDead), std::set<TokenId>{11});
}

TEST(TokenConstraintTest, MaskLogitsKeepsAllowedValuesAndDropsTheRest) {
  const auto v = small_vocabulary();
  const TokenConstraint c(compile("(?:ab|abc|x)+"), v);
  std::vector<float> logits(v->vocab_size() + 5);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i) * 0.25f;
  const std::vector<TokenId> generated = {5};  // "ab"
  std::vector<float> masked = logits;
  c.mask_logits(masked, generated);
  const std::set<TokenId> allowed = plain_allowed(c.automaton(), *v, c.state_after(generated));
  for (size_t i = 0; i < logits.size(); ++i) {
    if (allowed.count(static_cast<TokenId>(i))) {
      EXPECT_EQ(masked[i], logits[i]) << i;
    } else {
      EXPECT_EQ(masked[i], -std::numeric_limits<float>::infinity()) << i;
    }
  }
}

// Sampling under the constraint from random logits: every prefix stays alive and a
// sequence ends (EOS) only on a whole match.
TEST(TokenConstraintTest, ConstrainedDrawsStayInTheLanguage) {
  const auto v = small_vocabulary();
  const TokenConstraint c(compile("\\{\"a\": ?(?:0|[1-9][0-9]*)(?:, \"a\": ?[0-9]+)*\\}"), v);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int ended = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TokenId> generated;
    std::string text;
    for (int step = 0; step < 40; ++step) {
      std::vector<float> logits(static_cast<size_t>(v->vocab_size()));
      for (float& x : logits) x = normal(rng);
      c.mask_logits(logits, generated);
      const auto best =
          static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_TRUE(std::isfinite(logits[static_cast<size_t>(best)]));
      if (best == 11) {
        EXPECT_TRUE(c.automaton().matches(text)) << text;
        ++ended;
        break;
      }
      generated.push_back(best);
      text += v->token_bytes(best);
      ASSERT_NE(c.automaton().walk(c.automaton().start(), text), RegexAutomaton::kDead) << text;
    }
  }
  EXPECT_GT(ended, 20);
}

TEST(TokenConstraintTest, MasksEqualThePlainWalkOnDeepSeekV3Vocabulary) {
  const auto dir = testing::deepseek_v3_tokenizer_dir();
  if (!dir) GTEST_SKIP() << "tests/js/node_modules is missing: run scripts/install-test-js.sh";
  auto tokenizer = Tokenizer::load_from_dir(*dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const Tokenizer& t = *tokenizer;
  const auto eos = t.eos_id();
  ASSERT_TRUE(eos.has_value());
  const auto v = TokenVocabulary::build(t.vocab_size(),
                                        [&](TokenId id) -> std::optional<std::string_view> {
                                          if (!t.has_token(id) || t.is_special(id))
                                            return std::nullopt;
                                          return t.token_bytes(id);
                                        },
                                        {*eos});
  const std::string object =
      "\\{[ ]?\"name\"[ ]?:[ ]?\"(?:[^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt])*\"[ ]?,[ ]?"
      "\"age\"[ ]?:[ ]?-?(?:0|[1-9][0-9]*)[ ]?\\}";
  const TokenConstraint c(compile(object), v);
  // The states after a few prefixes of {"name": "Zoë", "age": 42}, each against the plain walk.
  const std::string text = "{\"name\": \"Zo\xC3\xAB\", \"age\": 42}";
  ASSERT_TRUE(c.automaton().matches(text));
  auto ids = t.encode(text, {.add_special_tokens = false});
  ASSERT_TRUE(ids.ok());
  std::vector<TokenId> prefix;
  double worst_ms = 0;
  for (size_t i = 0; i <= ids->size(); ++i) {
    const int32_t s = c.state_after(prefix);
    ASSERT_NE(s, RegexAutomaton::kDead);
    const auto start = std::chrono::steady_clock::now();
    const std::set<TokenId> got = mask_set(c, s);
    worst_ms =
        std::max(worst_ms,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    EXPECT_EQ(got, plain_allowed(c.automaton(), *v, s)) << "after " << i << " tokens";
    EXPECT_TRUE(got.count(i < ids->size() ? (*ids)[i] : *eos)) << "the text's own next token";
    if (i < ids->size()) prefix.push_back((*ids)[i]);
  }
  std::printf("DeepSeek-V3 vocabulary: %zu trie nodes; slowest mask (first use) %.2f ms\n",
              v->num_nodes(), worst_ms);
}

}  // namespace
}  // namespace peerserve::grammar
