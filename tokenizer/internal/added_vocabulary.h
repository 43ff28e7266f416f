// Added tokens of tokenizer.json ("added_tokens"): strings that are cut out of the text
// before pre-tokenization and map straight to their ids.
//
// Matching follows Hugging Face's AddedVocabulary: leftmost-longest, first among the
// tokens with normalized=false on the raw text, then among those with normalized=true on
// the pieces in between (this tokenizer's normalizer is the identity); single_word only
// matches between non-word characters; lstrip/rstrip widen a match over adjacent
// whitespace, which the token then swallows.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = true;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A piece of text after added-token matching: either an added token or plain text.
struct TextSegment {
  std::string_view text;
  int32_t added_id = -1;  // >= 0: the whole segment is this added token
};

class AddedVocabulary {
 public:
  static Result<AddedVocabulary> from_json(const nlohmann::json& added_tokens);

  // Splits `text` into plain text and added tokens. The views point into `text`.
  std::vector<TextSegment> split(std::string_view text) const;

  const AddedToken* find_by_id(int32_t id) const;
  const AddedToken* find_by_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the contents of one group of tokens (normalized or not).
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> children;
      int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    std::array<bool, 256> first_byte{};  // bytes that start some token
    void insert(std::string_view content, int32_t token);
    // Longest token starting at text[pos]: (token index, length) or (-1, 0).
    std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;
  };
  void split_with(const Trie& trie, std::string_view text, std::vector<TextSegment>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_trie_;         // normalized == false
  Trie normalized_trie_;  // normalized == true
};

}  // namespace peerserve
