#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace peerserve::grammar {
namespace {
// Longer tokens are not text in any tokenizer we load; the bound keeps depth in 16 bits.
constexpr size_t kMaxTokenBytes = std::numeric_limits<uint16_t>::max();
}  // namespace

std::shared_ptr<const TokenVocabulary> TokenVocabulary::build(
    int32_t vocab_size, const std::function<std::optional<std::string_view>(TokenId)>& text,
    std::vector<TokenId> end_tokens) {
  auto v = std::make_shared<TokenVocabulary>();
  v->vocab_size_ = std::max<int32_t>(vocab_size, 0);
  v->end_tokens_ = std::move(end_tokens);
  std::sort(v->end_tokens_.begin(), v->end_tokens_.end());
  v->end_tokens_.erase(std::unique(v->end_tokens_.begin(), v->end_tokens_.end()),
                       v->end_tokens_.end());
  std::vector<TokenId> ids;
  v->text_offset_.reserve(static_cast<size_t>(v->vocab_size_) + 1);
  v->text_offset_.push_back(0);
  for (TokenId id = 0; id < v->vocab_size_; ++id) {
    const std::optional<std::string_view> t = text(id);
    if (t && !t->empty() && t->size() <= kMaxTokenBytes) {
      v->text_ += *t;
      ids.push_back(id);
    }
    v->text_offset_.push_back(static_cast<uint32_t>(v->text_.size()));
  }
  // Sorted by bytes, consecutive strings share their common prefix's path: the trie comes
  // out in preorder with one pass and a stack of the current path.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](TokenId a, TokenId b) { return v->token_bytes(a) < v->token_bytes(b); });
  v->byte_.push_back(0);
  v->depth_.push_back(0);
  std::vector<uint32_t> path = {0};                  // node at each depth of the current string
  std::vector<std::pair<uint32_t, TokenId>> ending;  // (node, token)
  std::string_view previous;
  for (const TokenId id : ids) {
    const std::string_view s = v->token_bytes(id);
    size_t common = 0;
    while (common < s.size() && common < previous.size() && s[common] == previous[common]) {
      ++common;
    }
    path.resize(common + 1);
    for (size_t i = common; i < s.size(); ++i) {
      path.push_back(static_cast<uint32_t>(v->byte_.size()));
      v->byte_.push_back(static_cast<uint8_t>(s[i]));
      v->depth_.push_back(static_cast<uint16_t>(i + 1));
    }
    ending.emplace_back(path.back(), id);
    v->max_depth_ = std::max(v->max_depth_, static_cast<uint16_t>(s.size()));
    previous = s;
  }
  const size_t n = v->byte_.size();
  // A subtree ends at the next node that is not deeper.
  v->subtree_end_.assign(n, static_cast<uint32_t>(n));
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < n; ++i) {
    while (!open.empty() && v->depth_[open.back()] >= v->depth_[i]) {
      v->subtree_end_[open.back()] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  // `ending` is in node order already (ids were sorted by bytes).
  v->token_offset_.assign(n + 1, 0);
  for (const auto& [node, id] : ending) ++v->token_offset_[node + 1];
  std::partial_sum(v->token_offset_.begin(), v->token_offset_.end(), v->token_offset_.begin());
  v->token_ids_.reserve(ending.size());
  for (const auto& [node, id] : ending) v->token_ids_.push_back(id);
  return v;
}

std::string_view TokenVocabulary::token_bytes(TokenId id) const {
  if (id < 0 || id >= vocab_size_) return {};
  const auto i = static_cast<size_t>(id);
  return std::string_view(text_).substr(text_offset_[i], text_offset_[i + 1] - text_offset_[i]);
}

}  // namespace peerserve::grammar
