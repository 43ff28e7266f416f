#include "grammar/token_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace peerserve::grammar {
namespace {

void set_bit(std::vector<uint64_t>& bits, TokenId id) {
  bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (static_cast<size_t>(id) % 64);
}

bool any_bit(const std::vector<uint64_t>& bits) {
  for (const uint64_t w : bits) {
    if (w != 0) return true;
  }
  return false;
}

}  // namespace

TokenConstraint::TokenConstraint(std::shared_ptr<const RegexAutomaton> automaton,
                                 std::shared_ptr<const TokenVocabulary> vocabulary)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  end_only_.assign((static_cast<size_t>(vocabulary_->vocab_size()) + 63) / 64, 0);
  for (const TokenId id : vocabulary_->end_tokens()) {
    if (id >= 0 && id < vocabulary_->vocab_size()) set_bit(end_only_, id);
  }
}

int32_t TokenConstraint::advance(int32_t state, TokenId token) const {
  if (state == RegexAutomaton::kDead) return state;
  const std::string_view bytes = vocabulary_->token_bytes(token);
  if (bytes.empty()) return RegexAutomaton::kDead;  // an end or special token
  return automaton_->walk(state, bytes);
}

int32_t TokenConstraint::state_after(std::span<const TokenId> tokens) const {
  int32_t state = automaton_->start();
  for (const TokenId t : tokens) {
    state = advance(state, t);
    if (state == RegexAutomaton::kDead) break;
  }
  return state;
}

std::vector<uint64_t> TokenConstraint::compute_mask(int32_t state) const {
  const TokenVocabulary& v = *vocabulary_;
  std::vector<uint64_t> bits((static_cast<size_t>(v.vocab_size()) + 63) / 64, 0);
  // Preorder walk: at_depth[d] is the automaton's state after the first d bytes of the
  // current node's path; a dead prefix skips its whole subtree.
  std::vector<int32_t> at_depth(static_cast<size_t>(v.max_depth()) + 1);
  at_depth[0] = state;
  const size_t n = v.num_nodes();
  for (size_t node = 1; node < n;) {
    const uint16_t d = v.depth(node);
    const int32_t s = automaton_->step(at_depth[d - 1u], v.byte(node));
    if (s == RegexAutomaton::kDead) {
      node = v.subtree_end(node);
      continue;
    }
    at_depth[d] = s;
    for (const TokenId id : v.tokens_at(node)) set_bit(bits, id);
    ++node;
  }
  if (automaton_->accepting(state) || !any_bit(bits)) {
    for (size_t i = 0; i < bits.size(); ++i) bits[i] |= end_only_[i];
  }
  return bits;
}

const std::vector<uint64_t>& TokenConstraint::allowed(int32_t state) const {
  if (state == RegexAutomaton::kDead) return end_only_;
  {
    std::lock_guard lock(mutex_);
    if (const auto it = masks_.find(state); it != masks_.end()) return it->second;
  }
  // Computed outside the lock: two threads may both compute a new state's mask; the first
  // one stored wins and they are equal.
  std::vector<uint64_t> bits = compute_mask(state);
  std::lock_guard lock(mutex_);
  if (masks_.size() >= kMaxCachedStates) {
    // Past the cap (a pattern that wanders through very many states), masks are computed
    // each time instead of held: memory stays bounded by the cap.
    thread_local std::vector<uint64_t> uncached;
    uncached = std::move(bits);
    return uncached;
  }
  return masks_.try_emplace(state, std::move(bits)).first->second;
}

void TokenConstraint::mask_logits(std::span<float> logits,
                                  std::span<const TokenId> generated) const {
  const std::vector<uint64_t>& bits = allowed(state_after(generated));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t vocab = static_cast<size_t>(vocabulary_->vocab_size());
  const size_t covered = std::min(logits.size(), vocab);
  float* x = logits.data();
  size_t w = 0;
  // Whole words: skip the all-allowed ones, fill the none-allowed ones, and in the mixed ones
  // visit the disallowed bits only (inside a JSON string nearly every token is allowed).
  for (; (w + 1) * 64 <= covered; ++w) {
    const uint64_t word = bits[w];
    if (word == ~uint64_t{0}) continue;
    float* row = x + w * 64;
    if (word == 0) {
      std::fill_n(row, 64, kNegInf);
      continue;
    }
    for (uint64_t off = ~word; off != 0; off &= off - 1) row[std::countr_zero(off)] = kNegInf;
  }
  for (size_t i = w * 64; i < covered; ++i) {
    if (!((bits[i / 64] >> (i % 64)) & 1u)) x[i] = kNegInf;
  }
  for (size_t i = covered; i < logits.size(); ++i) x[i] = kNegInf;
}

}  // namespace peerserve::grammar
