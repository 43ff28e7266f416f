#include "model/checkpoint/test_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

namespace peerserve {
namespace {

using nlohmann::ordered_json;

// The constants below are copied verbatim from DeepSeek-V3's tokenizer.json and
// tokenizer_config.json (normalizer, pre_tokenizer, post_processor, decoder, chat_template,
// the special tokens with ids < 3 or >= 128800) and the first 238 entries of its BPE merge
// list, which only combine byte tokens and earlier merges, so they form a valid BPE model on
// their own.
// Generated from DeepSeek-V3's tokenizer.json / tokenizer_config.json (see file comment).
constexpr const char* kNormalizerJson = R"json({"type": "Sequence", "normalizers": []})json";
constexpr const char* kPreTokenizerJson =
    R"json({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false}, {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": false}, {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})json";
constexpr const char* kPostProcessorJson =
    R"json({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})json";
constexpr const char* kDecoderJson =
    R"json({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})json";
constexpr const char* kChatTemplate =
    R"tmpl({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '

' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '
' + '```json' + '
' + tool['function']['arguments'] + '
' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'
' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '
' + '```json' + '
' + tool['function']['arguments'] + '
' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'
<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %})tmpl";
constexpr const char* kAddedTokensJson =
    R"json([{"id": 0, "content": "<｜begin▁of▁sentence｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 1, "content": "<｜end▁of▁sentence｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 2, "content": "<｜▁pad▁｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 128800, "content": "<｜fim▁hole｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128801, "content": "<｜fim▁begin｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128802, "content": "<｜fim▁end｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128803, "content": "<｜User｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128804, "content": "<｜Assistant｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128805, "content": "<|EOT|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": true}, {"id": 128806, "content": "<｜tool▁calls▁begin｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128807, "content": "<｜tool▁calls▁end｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128808, "content": "<｜tool▁call▁begin｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128809, "content": "<｜tool▁call▁end｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128810, "content": "<｜tool▁outputs▁begin｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128811, "content": "<｜tool▁outputs▁end｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128812, "content": "<｜tool▁output▁begin｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128813, "content": "<｜tool▁output▁end｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 128814, "content": "<｜tool▁sep｜>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}])json";
constexpr const char* kMerges[] = {
    "Ġ t",   "Ġ a",   "i n",    "Ġ Ġ",   "h e",   "e r",  "o n",       "r e",    "e n",   "a t",
    "Ġ s",   "Ġt he", "Ċ Ċ",    "o r",   "e s",   "Ġ c",  "ä ¸",       "a n",    "Ġ o",   "i s",
    "i t",   "Ġ p",   "Ġ w",    "a l",   "Ġ d",   "e d",  "Ġ f",       "ï ¼",    "a r",   "in g",
    "n d",   "ĠĠ ĠĠ", "Ġ b",    "Ġ m",   "o u",   "Ġo f", "Ġ in",      "i on",   "i c",   "ã Ģ",
    "ç ļ",   "â Ģ",   "çļ Ħ",   "l e",   "ï¼ Į",  "Ġt o", "Ġa nd",     "a s",    "r o",   "ä º",
    "en t",  "Ġ h",   "c t",    "Ġ e",   "Ġ n",   "Ġ l",  "Ġt h",      "o m",    "e l",   "s t",
    "e t",   "ãĢ Ĥ",  "i l",    "Ġ re",  "ä »",   "å ı",  "æ ľ",       "à ¸",    "Ġ S",   "i m",
    "i d",   "Ġ T",   "o l",    "Ġ Ð",   "u t",   "Ġ A",  "å ħ",       "Ġ g",    "r a",   "å ¤",
    ". ĊĊ",  "i v",   "at ion", "Ġ I",   "Ġ (",   "Ġ is", "Ġ C",       "u r",    "o t",   "c h",
    "u s",   "i g",   "è ¿",    "å Ī",   "c e",   "æ ĺ",  "Ð ¾",       "a m",    "ä ½",   "å ®",
    "o w",   "a d",   "ĠĠ Ġ",   "Ġf or", "u l",   "å Ĳ",  "å ľ",       "Ġb e",   "l y",   "Ð µ",
    "Ġ |",   "Ġs t",  "u n",    "# #",   "Ġ M",   "Ġ v",  "ä ¹",       "o s",    "Ġ on",  "ä¸ Ģ",
    "Ð °",   "Ġ P",   "e m",    "ç Ķ",   "Ġ y",   "æ Ī",  "ĠĠĠĠ ĠĠĠĠ", "a y",    "er s",  "i r",
    "æĺ ¯",  "à ¦",   "Ø §",    "Ġd e",  "Ð ¸",   "i f",  "u m",       "Ġth at", "2 0",   "å °",
    "Ġc on", "it h",  "o d",    "t er",  "q u",   "ç »",  "å Ĭ",       "Ġ B",    "Ñ Ĥ",   "è ¯",
    "a g",   "ãĢ ģ",  "Ġa n",   "Ġa s",  "Ġp ro", "he r", "ã ģ",       "es t",   "æ ĸ",   "Ġw ith",
    "Ð ½",   "Ġ D",   "å Ń",    "ä¸ į",  "Ġa l",  "å Ľ",  "a b",       ". .",    "v e",   "âĢ ľ",
    "äº Ĩ",  "âĢ Ŀ",  "æ Ĺ",    "v er",  "Ġ R",   "at e", "is t",      "Ġ it",   "Ġ H",   "Ġ =",
    "a c",   "Ġy ou", "æ Ŀ",    "âĢ Ļ",  "re s",  "Ñ ģ",  "åľ ¨",      "Ġ E",    "Ġ F",   "Ġ W",
    "es s",  "æľ ī",  "è ®",    "Ñ Ģ",   "å į",   "e ct", "ĠT he",     "p p",    "ä ¼",   "an d",
    "Ġw h",  "r i",   "æ ī",    "Ġ L",   "t h",   "å ¹",  "Ġc om",     "Ð¾ Ð",   "s e",   "Ġ he",
    "Ġ or",  "äº º",  "Ġ N",    "Ġe x",  "Ġ k",   "å ¾",  "il l",      "o p",    "Ġa re", "ãĢĤ ĊĊ",
    "an t",  "a k",   "it y",   "or t",  "å ·",   "o c",  "é ĩ",       "å ĩ",    "å ¼",   "Ġs e",
    "Ġ G",   "m ent", "h t",    "o re",  "è Ģ",   "Ġ r",  "Ù Ħ",       "ro m",
};

constexpr int64_t kFirstByteTokenId = 3;  // after bos, eos, pad (as in V3)

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the others to U+0100+.
std::vector<std::string> byte_level_chars() {
  std::vector<int> bytes, codepoints;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (printable) {
      bytes.push_back(b);
      codepoints.push_back(b);
    }
  }
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bytes.begin(), bytes.end(), b) == bytes.end()) {
      bytes.push_back(b);
      codepoints.push_back(256 + extra++);
    }
  }
  // DeepSeek-V3's vocab lists the 256 byte tokens ordered by code point.
  std::sort(codepoints.begin(), codepoints.end());
  std::vector<std::string> chars;
  for (int cp : codepoints) {
    std::string utf8;
    if (cp < 0x80) {
      utf8 += static_cast<char>(cp);
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    chars.push_back(utf8);
  }
  return chars;
}

ordered_json added_tokens() {
  ordered_json tokens = ordered_json::parse(kAddedTokensJson);
  // V3 puts its chat/tool tokens at 128800+; ours follow the merges directly.
  int64_t next_id = kFirstByteTokenId + 256 + static_cast<int64_t>(std::size(kMerges));
  for (ordered_json& token : tokens) {
    if (token["id"].get<int64_t>() >= kFirstByteTokenId) token["id"] = next_id++;
  }
  return tokens;
}

}  // namespace

int64_t test_tokenizer_vocab_size() {
  int64_t max_id = 0;
  for (const ordered_json& token : added_tokens()) {
    max_id = std::max(max_id, token["id"].get<int64_t>());
  }
  return max_id + 1;
}

std::string test_tokenizer_json() {
  ordered_json vocab = ordered_json::object();
  const ordered_json specials = added_tokens();
  for (const ordered_json& token : specials) {
    if (token["id"].get<int64_t>() < kFirstByteTokenId) vocab[token["content"]] = token["id"];
  }
  int64_t id = kFirstByteTokenId;
  for (const std::string& c : byte_level_chars()) vocab[c] = id++;
  ordered_json merges = ordered_json::array();
  for (const char* merge : kMerges) {
    const std::string m(merge);
    const size_t space = m.find(' ');
    vocab[m.substr(0, space) + m.substr(space + 1)] = id++;
    merges.push_back(m);
  }

  ordered_json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = specials;
  t["normalizer"] = ordered_json::parse(kNormalizerJson);
  t["pre_tokenizer"] = ordered_json::parse(kPreTokenizerJson);
  t["post_processor"] = ordered_json::parse(kPostProcessorJson);
  t["decoder"] = ordered_json::parse(kDecoderJson);
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merges}};
  return t.dump(2) + "\n";
}

std::string test_tokenizer_config_json() {
  auto added_token = [](const char* content) {
    return ordered_json{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
                        {"normalized", true},     {"rstrip", false},    {"single_word", false}};
  };
  ordered_json c;
  c["add_bos_token"] = true;
  c["add_eos_token"] = false;
  c["bos_token"] = added_token("<｜begin▁of▁sentence｜>");
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = added_token("<｜end▁of▁sentence｜>");
  c["legacy"] = true;
  c["model_max_length"] = 131072;
  c["pad_token"] = added_token("<｜end▁of▁sentence｜>");
  c["sp_model_kwargs"] = ordered_json::object();
  c["unk_token"] = nullptr;
  c["tokenizer_class"] = "LlamaTokenizerFast";
  c["chat_template"] = kChatTemplate;
  return c.dump(2) + "\n";
}

}  // namespace peerserve
