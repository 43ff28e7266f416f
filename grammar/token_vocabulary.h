// A tokenizer's vocabulary as the byte strings its tokens add to decoded text, in a trie
// laid out in depth-first order, for computing structured-output token masks
// (grammar/token_constraint.h): a walk over the trie beside an automaton visits each
// shared prefix once and skips a whole subtree when the automaton rejects its prefix.
//
// Special tokens (BOS, EOS, chat markers) spell no text and are left out; the end tokens
// are the ones a constrained sequence may finish with (the model's EOS ids).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peerserve::grammar {

using TokenId = int32_t;

class TokenVocabulary {
 public:
  // `text(id)` for id in [0, vocab_size): the token's bytes, or nullopt for a token that
  // spells no text (special, or no token with that id). Empty strings are left out too.
  static std::shared_ptr<const TokenVocabulary> build(
      int32_t vocab_size, const std::function<std::optional<std::string_view>(TokenId)>& text,
      std::vector<TokenId> end_tokens);

  int32_t vocab_size() const { return vocab_size_; }
  std::span<const TokenId> end_tokens() const { return end_tokens_; }
  // The token's bytes ("" for one that spells no text).
  std::string_view token_bytes(TokenId id) const;

  // The trie, nodes in depth-first preorder; node 0 is the root (the empty prefix).
  size_t num_nodes() const { return byte_.size(); }
  uint8_t byte(size_t node) const { return byte_[node]; }     // the edge into the node
  uint16_t depth(size_t node) const { return depth_[node]; }  // root 0
  // One past the last node of the node's subtree.
  uint32_t subtree_end(size_t node) const { return subtree_end_[node]; }
  // The tokens whose bytes end at the node.
  std::span<const TokenId> tokens_at(size_t node) const {
    return {token_ids_.data() + token_offset_[node], token_ids_.data() + token_offset_[node + 1]};
  }
  uint16_t max_depth() const { return max_depth_; }

 private:
  int32_t vocab_size_ = 0;
  std::vector<TokenId> end_tokens_;
  std::vector<uint32_t> text_offset_;  // [vocab_size + 1] into text_
  std::string text_;
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> subtree_end_;
  std::vector<uint32_t> token_offset_;  // [nodes + 1] into token_ids_
  std::vector<TokenId> token_ids_;
  uint16_t max_depth_ = 0;
};

}  // namespace peerserve::grammar
