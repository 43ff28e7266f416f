#include "tokenizer/internal/added_vocabulary.h"

#include "tokenizer/internal/utf8.h"

namespace peerserve {
namespace {

// Hugging Face uses char::is_whitespace (Unicode White_Space) for lstrip/rstrip and
// char::is_alphanumeric-or-'_' for single_word; these cover ASCII plus the common
// Unicode spaces, and treat every non-ASCII letter as a word character.
bool is_white_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
bool is_word_char(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return !is_white_space(c);
}

// The code point that ends right before `end` (REQUIRES: end > 0, valid UTF-8).
std::pair<char32_t, size_t> code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return {utf8::decode_valid(text.substr(start, end - start)), end - start};
}
std::pair<char32_t, size_t> code_point_at(std::string_view text, size_t pos) {
  const utf8::Sequence seq = utf8::next_sequence(text.substr(pos));
  return {utf8::decode_valid(text.substr(pos, seq.length)), seq.length};
}

bool json_flag(const nlohmann::json& token, const char* key, bool fallback) {
  const auto it = token.find(key);
  return it != token.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view content, int32_t token) {
  first_byte[static_cast<unsigned char>(content[0])] = true;
  int32_t node = 0;
  for (unsigned char c : content) {
    const auto it = nodes[node].children.find(c);
    if (it != nodes[node].children.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes.size());
      nodes[node].children.emplace(c, child);
      nodes.emplace_back();
      node = child;
    }
  }
  if (nodes[node].token < 0) nodes[node].token = token;
}

std::pair<int32_t, size_t> AddedVocabulary::Trie::longest_at(std::string_view text,
                                                             size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& children = nodes[node].children;
    const auto it = children.find(static_cast<unsigned char>(text[i]));
    if (it == children.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) best = {nodes[node].token, i + 1 - pos};
  }
  return best;
}

Result<AddedVocabulary> AddedVocabulary::from_json(const nlohmann::json& added_tokens) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  if (!added_tokens.is_array())
    return invalid_argument("tokenizer.json: 'added_tokens' must be an array");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const auto& t = added_tokens[i];
    const std::string where = "tokenizer.json: added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX / 2 ||
        !t.contains("content") || !t["content"].is_string()) {
      return invalid_argument(
          where + ": expected {\"id\": non-negative integer, \"content\": string, ...}");
    }
    AddedToken token;
    token.id = static_cast<int32_t>(t["id"].get<int64_t>());
    token.content = t["content"].get<std::string>();
    if (token.content.empty() || !utf8::is_valid(token.content)) {
      return invalid_argument(where + ": content must be non-empty valid UTF-8");
    }
    token.special = json_flag(t, "special", false);
    token.normalized = json_flag(t, "normalized", !token.special);
    token.lstrip = json_flag(t, "lstrip", false);
    token.rstrip = json_flag(t, "rstrip", false);
    token.single_word = json_flag(t, "single_word", false);
    if (vocab.by_id_.count(token.id)) {
      return invalid_argument(where + ": id " + std::to_string(token.id) + " is used twice");
    }
    const auto index = static_cast<int32_t>(vocab.tokens_.size());
    vocab.by_id_.emplace(token.id, vocab.tokens_.size());
    vocab.by_content_.emplace(token.content, vocab.tokens_.size());
    (token.normalized ? vocab.normalized_trie_ : vocab.raw_trie_).insert(token.content, index);
    vocab.tokens_.push_back(std::move(token));
  }
  return vocab;
}

const AddedToken* AddedVocabulary::find_by_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_by_content(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

std::vector<TextSegment> AddedVocabulary::split(std::string_view text) const {
  std::vector<TextSegment> first;
  split_with(raw_trie_, text, first);
  std::vector<TextSegment> out;
  for (const TextSegment& segment : first) {
    if (segment.added_id >= 0) {
      out.push_back(segment);
    } else {
      split_with(normalized_trie_, segment.text, out);
    }
  }
  return out;
}

void AddedVocabulary::split_with(const Trie& trie, std::string_view text,
                                 std::vector<TextSegment>& out) const {
  if (trie.nodes.size() == 1) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  size_t plain_start = 0;  // start of the pending plain text
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [index, length] = trie.longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(index)];
    size_t start = pos;
    size_t end = pos + length;
    if (token.single_word) {
      const bool word_before = start > 0 && is_word_char(code_point_before(text, start).first);
      const bool word_after = end < text.size() && is_word_char(code_point_at(text, end).first);
      if (word_before || word_after) {
        pos = end;  // Hugging Face discards the match and resumes after it
        continue;
      }
    }
    if (token.lstrip) {
      while (start > plain_start) {
        const auto [c, n] = code_point_before(text, start);
        if (!is_white_space(c)) break;
        start -= n;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        const auto [c, n] = code_point_at(text, end);
        if (!is_white_space(c)) break;
        end += n;
      }
    }
    if (start > plain_start) out.push_back({text.substr(plain_start, start - plain_start), -1});
    out.push_back({text.substr(start, end - start), token.id});
    pos = end;
    plain_start = end;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace peerserve
