// Tokenizer building blocks on small hand-made tokenizer.json files, with expectations
// worked out by hand from Hugging Face's documented semantics (e.g. the
// SplitDelimiterBehavior examples of the tokenizers documentation).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/model_loading/fifo_in_place.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/internal/pre_tokenizer.h"
#include "tokenizer/internal/regex.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

using nlohmann::json;

// GPT-2's byte-to-character table, written out independently of tokenizer/internal.
std::string byte_char(int b) {
  const auto printable = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += printable(x) ? 0 : 1;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Vocabulary: id == byte value for the 256 single bytes, then `extra` tokens from 256 on.
json make_tokenizer_json(const std::vector<std::string>& extra, const json& merges,
                         const json& added_tokens = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added_tokens},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
}

Result<Tokenizer> load(const json& tokenizer_json, const json& config = json()) {
  return Tokenizer::from_sources({tokenizer_json.dump(), config.is_null() ? "" : config.dump()});
}

std::vector<TokenId> encode(const Tokenizer& t, const std::string& text) {
  auto ids = t.encode(text, {.add_special_tokens = false});
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<TokenId>{};
}

TEST(TokenizerComponentsTest, UnsupportedComponentsAreNamed) {
  const json base = make_tokenizer_json({}, json::array());
  const std::vector<std::pair<std::pair<std::string, json>, std::string>> cases = {
      {{"normalizer", {{"type", "NFKC"}}}, "normalizer type 'NFKC'"},
      {{"pre_tokenizer", {{"type", "Whitespace"}}}, "pre_tokenizer type 'Whitespace'"},
      {{"decoder", {{"type", "Metaspace"}}}, "decoder type 'Metaspace'"},
      {{"post_processor", {{"type", "BertProcessing"}}}, "post_processor type 'BertProcessing'"},
      {{"truncation", {{"max_length", 5}}}, "'truncation'"},
      {{"pre_tokenizer",
        {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}}},
       "behavior 'Sideways'"},
      {{"pre_tokenizer",
        {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}},
       "does not compile"},
  };
  for (const auto& [change, expected] : cases) {
    json config = base;
    config[change.first] = change.second;
    auto t = load(config);
    ASSERT_FALSE(t.ok()) << change.first;
    EXPECT_NE(t.status().message().find(expected), std::string::npos) << t.status().message();
  }
  json wordpiece = base;
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_NE(load(wordpiece).status().message().find("model type 'WordPiece'"), std::string::npos);
  json bad_merge = make_tokenizer_json({}, json::array({"a zz"}));
  EXPECT_NE(load(bad_merge).status().message().find("merges[0]"), std::string::npos);
  EXPECT_NE(Tokenizer::from_sources({"{not json", ""}).status().message().find("not valid JSON"),
            std::string::npos);
  EXPECT_FALSE(Tokenizer::load_from_dir("/nonexistent/dir").ok());
  {  // a FIFO for tokenizer.json: refused, not waited on for a writer
    const auto dir = std::filesystem::temp_directory_path() /
                     ("peerserve_tokenizer_fifo_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string fifo = (dir / "tokenizer.json").string();
    ASSERT_TRUE(testing::replace_with_fifo(fifo));
    const Status s =
        testing::load_beside_fifo(fifo, [&] { return Tokenizer::load_from_dir(dir).status(); });
    std::filesystem::remove_all(dir);
    EXPECT_NE(s.message().find("tokenizer.json: a FIFO, expected a regular file"),
              std::string::npos)
        << s.to_string();
  }
  const json wrong_type = {{"add_bos_token", "yes"}};
  EXPECT_NE(load(base, wrong_type).status().message().find("add_bos_token must be true or false"),
            std::string::npos);
  // An added token on a model token's id with other text (Hugging Face would renumber it;
  // "H" encoded to it and decoded as "<X>"); the same text is fine (special tokens listed
  // in both places).
  json collides = base;
  collides["added_tokens"] = json::array({{{"id", 'H'}, {"content", "<X>"}, {"special", true}}});
  EXPECT_NE(load(collides).status().message().find("which is the model's token 'H'"),
            std::string::npos)
      << load(collides).status().to_string();
  collides["added_tokens"] = json::array({{{"id", 'H'}, {"content", "H"}, {"special", true}}});
  EXPECT_TRUE(load(collides).ok()) << load(collides).status().to_string();
  json config = {{"clean_up_tokenization_spaces", true}};
  EXPECT_NE(load(base, config).status().message().find("clean_up_tokenization_spaces"),
            std::string::npos);
}

TEST(TokenizerComponentsTest, MergesApplyLowestRankFirst) {
  // "b c" outranks "a b": "abc" -> a, bc. "a a" on "aaa" merges the leftmost pair first.
  auto t = load(make_tokenizer_json({"bc", "ab", "aa"}, json::array({"b c", "a b", "a a"})));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(encode(*t, "abc"), (std::vector<TokenId>{'a', 256}));
  EXPECT_EQ(encode(*t, "abx"), (std::vector<TokenId>{257, 'x'}));
  EXPECT_EQ(encode(*t, "aaa"), (std::vector<TokenId>{258, 'a'}));
  EXPECT_EQ(encode(*t, "aaaa"), (std::vector<TokenId>{258, 258}));
  // Merges in the newer ["a", "b"] form.
  auto pairs = load(make_tokenizer_json({"ab"}, json::array({json::array({"a", "b"})})));
  ASSERT_TRUE(pairs.ok());
  EXPECT_EQ(encode(*pairs, "ab"), (std::vector<TokenId>{256}));
  // Byte-level: a space is "Ġ" in the vocabulary; merges across it work the same.
  auto spaced = load(make_tokenizer_json({"Ġa"}, json::array({"Ġ a"})));
  ASSERT_TRUE(spaced.ok());
  EXPECT_EQ(encode(*spaced, "a a"), (std::vector<TokenId>{'a', 256}));
  EXPECT_EQ(*spaced->decode(std::vector<TokenId>{'a', 256}), "a a");
}

TEST(TokenizerComponentsTest, AddedTokenFlags) {
  const json added = json::array({
      {{"id", 300}, {"content", "<L>"}, {"lstrip", true}, {"normalized", false}, {"special", true}},
      {{"id", 301}, {"content", "<R>"}, {"rstrip", true}, {"normalized", false}, {"special", true}},
      {{"id", 302},
       {"content", "<W>"},
       {"single_word", true},
       {"normalized", false},
       {"special", false}},
      {{"id", 303}, {"content", "abc"}, {"normalized", true}, {"special", false}},
      {{"id", 304}, {"content", "bc"}, {"normalized", false}, {"special", false}},
  });
  auto t = load(make_tokenizer_json({}, json::array(), added));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // lstrip: the token takes the whitespace on its left.
  EXPECT_EQ(encode(*t, "x  <L>y"), (std::vector<TokenId>{'x', 300, 'y'}));
  // rstrip: the token takes the whitespace on its right.
  EXPECT_EQ(encode(*t, "x<R>  y"), (std::vector<TokenId>{'x', 301, 'y'}));
  // However long that whitespace is: 10,000 spaces and <L> are one token, within a limit of
  // 10 (the early check by byte length refused the text as "more than 10 tokens").
  const auto absorbed =
      t->encode(std::string(10000, ' ') + "<L>", {.add_special_tokens = false, .max_tokens = 10});
  ASSERT_TRUE(absorbed.ok()) << absorbed.status().to_string();
  EXPECT_EQ(*absorbed, (std::vector<TokenId>{300}));
  // single_word: only between non-word characters.
  EXPECT_EQ(encode(*t, "x<W>"), (std::vector<TokenId>{'x', '<', 'W', '>'}));
  EXPECT_EQ(encode(*t, "x <W>!"), (std::vector<TokenId>{'x', ' ', 302, '!'}));
  // normalized=false tokens are matched first, on the raw text: "bc" wins over "abc".
  EXPECT_EQ(encode(*t, "abc"), (std::vector<TokenId>{'a', 304}));
  EXPECT_EQ(encode(*t, "xabcx"), (std::vector<TokenId>{'x', 'a', 304, 'x'}));
  // Decoding: added tokens give their content; skip_special drops special ones only.
  const std::vector<TokenId> ids = {300, 'x', 302, 301};
  EXPECT_EQ(*t->decode(ids), "<L>x<W><R>");
  EXPECT_EQ(*t->decode(ids, {.skip_special_tokens = true}), "x<W>");
  EXPECT_TRUE(t->is_special(300));
  EXPECT_FALSE(t->is_special(302));
  EXPECT_EQ(t->vocab_size(), 305);
  EXPECT_FALSE(t->has_token(299));
}

TEST(TokenizerComponentsTest, SplitBehaviorsMatchTheTokenizersDocumentation) {
  // Hugging Face's example: "the-final--countdown" split on "-".
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Removed", {"the", "final", "countdown"}},
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
      {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}},
  };
  for (const auto& [behavior, expected] : cases) {
    auto pre = PreTokenizer::from_json({{"type", "Split"},
                                        {"pattern", {{"String", "-"}}},
                                        {"behavior", behavior},
                                        {"invert", false}});
    ASSERT_TRUE(pre.ok()) << pre.status().to_string();
    std::vector<std::string> pieces;
    ASSERT_TRUE(pre->split("the-final--countdown", pieces).ok());
    EXPECT_EQ(pieces, expected) << behavior;
  }
  // invert: the pattern describes the pieces, the text between matches is the delimiter
  // (so "Removed" drops the dashes).
  auto inverted = PreTokenizer::from_json({{"type", "Split"},
                                           {"pattern", {{"Regex", "[a-z]+"}}},
                                           {"behavior", "Removed"},
                                           {"invert", true}});
  ASSERT_TRUE(inverted.ok());
  std::vector<std::string> pieces;
  ASSERT_TRUE(inverted->split("the-final--countdown", pieces).ok());
  EXPECT_EQ(pieces, (std::vector<std::string>{"the", "final", "countdown"}));
}

// Split patterns are read as Oniguruma (Hugging Face's engine) reads them, not as PCRE2 does:
// \s does not take U+180E (PCRE2's horizontal space list has it; since Unicode 6.3 it is a
// format character), \w takes combining marks but not "²", \h is a hexadecimal digit.
TEST(TokenizerComponentsTest, RegexEscapesHaveOnigurumasMeaning) {
  const auto matches = [](const std::string& pattern, const std::string& text) {
    auto regex = Regex::compile(pattern);
    EXPECT_TRUE(regex.ok()) << pattern << ": " << regex.status().to_string();
    std::vector<std::pair<size_t, size_t>> found;
    EXPECT_TRUE(regex->find_all(text, found).ok());
    std::vector<std::string> out;
    for (auto [a, b] : found) out.push_back(text.substr(a, b - a));
    return out;
  };
  using V = std::vector<std::string>;
  const std::string mvs = "\xE1\xA0\x8E";  // U+180E
  EXPECT_EQ(matches("\\s+", "  " + mvs + "\n"), (V{"  ", "\n"}));
  EXPECT_EQ(matches("\\S+", "a" + mvs + "b c"), (V{"a" + mvs + "b", "c"}));
  EXPECT_EQ(matches("\\s", "\xC2\x85\xE3\x80\x80\xE2\x80\xA8"),  // NEL, ideographic space, U+2028
            (V{"\xC2\x85", "\xE3\x80\x80", "\xE2\x80\xA8"}));
  EXPECT_EQ(matches("\\w+", "e\xCC\x81t\xC2\xB2"), (V{"e\xCC\x81t"}));  // e + U+0301, t; ² not
  EXPECT_EQ(matches("\\W+", "ab\xC2\xB2 c"), (V{"\xC2\xB2 "}));
  // Alphabetic, not just letters: U+216B (Nl), U+3007 (Nl, as in 二〇二四), U+24D0 (So).
  EXPECT_EQ(matches("\\w+", "\xE2\x85\xAB \xE4\xBA\x8C\xE3\x80\x87 \xE2\x93\x90"),
            (V{"\xE2\x85\xAB", "\xE4\xBA\x8C\xE3\x80\x87", "\xE2\x93\x90"}));
  EXPECT_EQ(matches("\\h+", "a f 1g"), (V{"a", "f", "1"}));
  EXPECT_EQ(matches("\\H+", "a f"), (V{" "}));
  // Inside a class: the same members; \p{..}, \x{..}, escaped brackets and \Q..\E untouched.
  EXPECT_EQ(matches("[^\\s\\p{L}]+", "ab 12 " + mvs), (V{"12", mvs}));
  EXPECT_EQ(matches("[\\h\\]]+", "zA]9z"), (V{"A]9"}));
  EXPECT_EQ(matches("\\Q\\s\\E", "a\\sb \\s"), (V{"\\s", "\\s"}));
  EXPECT_EQ(matches("[[:digit:]\\s]+", "a1 2b"), (V{"1 2"}));
  EXPECT_FALSE(Regex::compile("[\\H]").ok());
  // DeepSeek-V3's own pattern pieces keep working.
  EXPECT_EQ(matches("\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", "a  \n b"), (V{"  \n", " "}));
}

TEST(TokenizerComponentsTest, LongInputsDoNotExhaustTheRegexStack) {
  auto t = load(make_tokenizer_json({}, json::array()));
  ASSERT_TRUE(t.ok());
  // `\s+(?!\S)` backtracks over the whole run: exercises the large JIT stack fallback.
  const std::string spaces(1 << 20, ' ');
  auto ids = t->encode(spaces + "x", {.add_special_tokens = false});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(ids->size(), spaces.size() + 1);
}

TEST(TokenizerComponentsTest, MaxTokensStopsEarlyAndOnlyWhenExceeded) {
  // "ab" merges: "abab ab" is 3 tokens (ab, ab, " ab" -> Ġ + ab).
  auto t = load(make_tokenizer_json({"ab"}, json::array({"a b"})));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string text = "abab ab";
  auto all = t->encode(text, {.add_special_tokens = false});
  ASSERT_TRUE(all.ok());
  const size_t n = all->size();
  ASSERT_GT(n, 1u);
  auto exact = t->encode(text, {.add_special_tokens = false, .max_tokens = n});
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, *all);
  auto over = t->encode(text, {.add_special_tokens = false, .max_tokens = n - 1});
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(over.status().message().find("more than " + std::to_string(n - 1) + " tokens"),
            std::string::npos);
  // A text far longer than the limit is refused by its byte length alone.
  const std::string huge(64 << 20, 'x');
  auto refused = t->encode(huge, {.add_special_tokens = false, .max_tokens = 1000});
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
}

// A token covering a multi-byte character counts its bytes in the early length check: three
// "你" (9 bytes) are three tokens and fit a limit of 3. The check counted the token's code
// points (1), so 9 bytes / 1 byte per token > 3 refused them.
TEST(TokenizerComponentsTest, MaxTokensCountsTheBytesOfMultiByteTokens) {
  // 你 = E4 BD A0: byte-level characters of E4 and BD merge, then that pair with A0.
  const std::string e4 = byte_char(0xE4), bd = byte_char(0xBD), a0 = byte_char(0xA0);
  auto t = load(make_tokenizer_json({e4 + bd, e4 + bd + a0},
                                    json::array({e4 + " " + bd, e4 + bd + " " + a0})));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string text = "你你你";
  auto ids = t->encode(text, {.add_special_tokens = false, .max_tokens = 3});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<TokenId>{257, 257, 257}));
}

TEST(TokenizerComponentsTest, SpecialTokensFromConfigOrPostProcessor) {
  const json added = json::array({
      {{"id", 300}, {"content", "<s>"}, {"normalized", false}, {"special", true}},
      {{"id", 301}, {"content", "</s>"}, {"normalized", false}, {"special", true}},
  });
  json with_template = make_tokenizer_json({}, json::array(), added);
  with_template["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]},
                                     "</s>": {"id": "</s>", "ids": [301], "tokens": ["</s>"]}}})");
  auto t = load(with_template);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->encode("x"), (std::vector<TokenId>{300, 'x', 301}));
  EXPECT_EQ(*t->encode("x", {.add_special_tokens = false}), (std::vector<TokenId>{'x'}));

  // tokenizer_config.json's add_bos_token/add_eos_token take precedence (LlamaTokenizerFast).
  const json config = {{"add_bos_token", true},
                       {"add_eos_token", true},
                       {"bos_token", "<s>"},
                       {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}}}};
  auto llama = load(make_tokenizer_json({}, json::array(), added), config);
  ASSERT_TRUE(llama.ok()) << llama.status().to_string();
  EXPECT_EQ(*llama->encode("x"), (std::vector<TokenId>{300, 'x', 301}));
  EXPECT_EQ(llama->bos_token(), "<s>");
  EXPECT_EQ(*llama->eos_id(), 301);

  // LlamaTokenizerFast without the flags: transformers defaults add_bos_token to true (and
  // add_eos_token to false) over tokenizer.json's post-processor; BOS was left out.
  const json llama_defaults = {{"tokenizer_class", "LlamaTokenizerFast"}, {"bos_token", "<s>"}};
  auto defaults = load(with_template, llama_defaults);
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(*defaults->encode("x"), (std::vector<TokenId>{300, 'x'}));
  auto other_class = load(with_template, {{"tokenizer_class", "PreTrainedTokenizerFast"}});
  ASSERT_TRUE(other_class.ok()) << other_class.status().to_string();
  EXPECT_EQ(*other_class->encode("x"), (std::vector<TokenId>{300, 'x', 301}));  // its template

  const json missing_bos = {{"add_bos_token", true}, {"bos_token", "<nope>"}};
  EXPECT_NE(load(make_tokenizer_json({}, json::array(), added), missing_bos)
                .status()
                .message()
                .find("<nope>"),
            std::string::npos);
  // A template that does not parse disables only chat rendering, with the parse error.
  const json bad_template = {{"chat_template", "{% macro x() %}{% endmacro %}"}};
  auto no_chat = load(make_tokenizer_json({}, json::array(), added), bad_template);
  ASSERT_TRUE(no_chat.ok());
  EXPECT_EQ(no_chat->chat_template(), nullptr);
  auto rendered = no_chat->apply_chat_template({});
  ASSERT_FALSE(rendered.ok());
  EXPECT_NE(rendered.status().message().find("macro"), std::string::npos)
      << rendered.status().message();
}

TEST(TokenizerComponentsTest, InvalidUtf8IsReplacedPerMaximalSubpart) {
  auto t = load(make_tokenizer_json({}, json::array()));
  ASSERT_TRUE(t.ok());
  const std::string replacement = "\xEF\xBF\xBD";
  // E2 82 is a truncated 3-byte sequence (one U+FFFD); C0 can never start one (one each).
  EXPECT_EQ(*t->decode(encode(*t, "a\xE2\x82z\xC0\xAF")),
            "a" + replacement + "z" + replacement + replacement);
  EXPECT_EQ(*t->decode(std::vector<TokenId>{0xF0, 0x9F, 0x98}), replacement);
  EXPECT_EQ(*t->decode(std::vector<TokenId>{0xF0, 0x9F, 0x98, 0x80}), "😀");
}

// A model vocabulary larger than the tokenizer's (make-test-model --preset v2-lite: 102400
// ids, a 512-id tokenizer; DeepSeek-V3 itself: 129280 and 128815) samples ids that name no
// token. Hugging Face's decode drops them before the decoder runs (filter_map over
// id_to_token), so the bytes on either side join up. The engine and `generate` do the same:
// IncrementalDetokenizer::push refuses such an id without changing its state, and they
// skip it, so the streamed text is the decode of the other ids, and no request fails.
TEST(TokenizerComponentsTest, IdsWithoutATokenAreSkippedAsHuggingFaceDoes) {
  auto t = load(make_tokenizer_json({}, json::array()));
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->vocab_size(), 256);
  // "a€z" with ids that name no token inside the 3-byte character and between tokens.
  const std::vector<TokenId> sampled = {'a', 0xE2, 256, 0x82, 102399, 0xAC, 5000, 'z'};
  std::string streamed;
  IncrementalDetokenizer detokenizer(*t);
  for (TokenId id : sampled) {
    Result<std::string> piece = detokenizer.push(id);
    if (!t->has_token(id)) {
      EXPECT_FALSE(piece.ok()) << id;
      EXPECT_EQ(detokenizer.pending_bytes().size(), id == 5000 ? 0u : id == 256 ? 1u : 2u) << id;
      continue;
    }
    ASSERT_TRUE(piece.ok()) << id;
    streamed += *piece;
  }
  streamed += detokenizer.finish();
  EXPECT_EQ(streamed, "a€z");
  std::vector<TokenId> known;
  for (TokenId id : sampled) {
    if (t->has_token(id)) known.push_back(id);
  }
  EXPECT_EQ(*t->decode(known), streamed);
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

std::string load_error(const json& tokenizer_json, const json& config = json()) {
  auto t = Tokenizer::from_sources({tokenizer_json.dump(), config.is_null() ? "" : config.dump()});
  return t.ok() ? "" : t.status().message();
}

// tokenizer.json comes with a downloaded checkpoint: ids are checked against the size of
// the vocabulary before anything is allocated for them.
TEST(TokenizerHostileFilesTest, VocabIdsAreCheckedAgainstTheVocabularySize) {
  json file = make_tokenizer_json({"ab"}, json::array({"a b"}));
  file["model"]["vocab"]["ab"] = (1 << 30) - 1;  // used to allocate ~34 GB, then abort
  std::string error = load_error(file);
  EXPECT_NE(error.find("tokenizer.json: model.vocab['ab'] = 1073741823 is out of range"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("below 1538"), std::string::npos) << error;  // 2 * 257 + 1024

  file["model"]["vocab"]["ab"] = 1 << 30;
  EXPECT_NE(load_error(file).find("model.vocab['ab'] = 1073741824, expected a non-negative"),
            std::string::npos);
  file["model"]["vocab"]["ab"] = 1537;  // a gap is fine
  EXPECT_EQ(load_error(file), "");

  json added = make_tokenizer_json(
      {}, json::array(), json::array({{{"id", 1 << 29}, {"content", "<x>"}, {"special", true}}}));
  error = load_error(added);
  EXPECT_NE(error.find("tokenizer.json: added_tokens has id 536870912, out of range"),
            std::string::npos)
      << error;
}

TEST(TokenizerHostileFilesTest, PostProcessorIdsAreRangeChecked) {
  const json added = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}}});
  const auto with_ids = [&](const json& ids) {
    json file = make_tokenizer_json({}, json::array(), added);
    file["post_processor"] = {{"type", "TemplateProcessing"},
                              {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}},
                                                      {{"Sequence", {{"id", "A"}}}}})},
                              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", ids}}}}}};
    return file;
  };
  for (const json& bad : {json::array({-7}), json::array({1e20}), json::array({1.5}),
                          json::array({"300"}), json::array({4294967296LL})}) {
    const std::string error = load_error(with_ids(bad));
    EXPECT_NE(error.find("special token '<s>' has id"), std::string::npos) << bad << error;
  }
  for (const json& absent : {json::array({299}), json::array({301}), json::array({100000})}) {
    const std::string error = load_error(with_ids(absent));
    EXPECT_NE(error.find("post_processor adds token id"), std::string::npos) << absent << error;
    EXPECT_NE(error.find("not in the vocabulary"), std::string::npos) << error;
  }
  auto ok = Tokenizer::from_sources({with_ids(json::array({300})).dump(), ""});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(*ok->encode("x"), (std::vector<TokenId>{300, 'x'}));
}

// \C matches one byte even in UTF mode, cutting characters that later steps match
// without a UTF check.
TEST(TokenizerHostileFilesTest, BackslashCIsRefused) {
  json file = make_tokenizer_json({}, json::array());
  file["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\C"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  const std::string error = load_error(file);
  EXPECT_NE(error.find("\\C"), std::string::npos) << error;
  EXPECT_NE(error.find("does not compile"), std::string::npos) << error;
}

// Built as text: copying a deep nlohmann::json would itself recurse.
TEST(TokenizerHostileFilesTest, DeepNestingIsRefused) {
  const int kDeep = 100000;
  std::string decoder;
  for (int i = 0; i < kDeep; ++i) decoder += R"({"type": "Sequence", "decoders": [)";
  decoder += R"({"type": "ByteLevel"})";
  for (int i = 0; i < kDeep; ++i) decoder += "]}";
  std::string file = make_tokenizer_json({}, json::array()).dump();
  file = file.substr(0, file.size() - 1) + R"(, "decoder": )" + decoder + "}";
  auto t = Tokenizer::from_sources({file, ""});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.json: nested deeper than 64 levels"),
            std::string::npos)
      << t.status().message();
  const std::string config =
      R"({"chat_template": )" + std::string(kDeep, '[') + std::string(kDeep, ']') + "}";
  auto c = Tokenizer::from_sources({make_tokenizer_json({}, json::array()).dump(), config});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tokenizer_config.json: nested deeper"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace peerserve
