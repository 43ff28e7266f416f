// A fake model for scheduler and engine tests that nevertheless checks the paged KV
// bookkeeping: its "KV cache" stores token ids in [num_blocks, block_size] slots, each step
// writes the chunk's tokens through the block table and then reads the whole context back
// through the block table. The next token is a hash of that context, so a wrong block
// table, a shared block that got overwritten or a prefix-cache hit on the wrong block all
// change the output compared with reference_generate(), which works on plain token lists.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "runtime/executor.h"

namespace peerserve::testing {

// The fake model's output vocabulary: `alphabet[i]` for i in [0, alphabet.size()).
inline std::vector<TokenId> iota_alphabet(int32_t vocab) {
  std::vector<TokenId> a(vocab);
  for (int32_t i = 0; i < vocab; ++i) a[i] = i;
  return a;
}

inline TokenId fake_next_token(std::span<const TokenId> context,
                               const std::vector<TokenId>& alphabet) {
  uint64_t h = 1469598103934665603ULL;
  for (TokenId t : context) {
    h ^= static_cast<uint32_t>(t) + 0x9e37U;
    h *= 1099511628211ULL;
  }
  h ^= h >> 29;
  return alphabet[h % alphabet.size()];
}

// What the fake model generates for one sequence, computed without any paging.
inline std::vector<TokenId> reference_generate(std::vector<TokenId> prompt, int32_t max_tokens,
                                               const std::vector<TokenId>& alphabet,
                                               std::optional<TokenId> eos,
                                               int64_t max_model_len = 1 << 30) {
  std::vector<TokenId> context = std::move(prompt);
  std::vector<TokenId> out;
  while (static_cast<int32_t>(out.size()) < max_tokens &&
         static_cast<int64_t>(context.size()) < max_model_len) {
    const TokenId t = fake_next_token(context, alphabet);
    out.push_back(t);
    context.push_back(t);
    if (eos && t == *eos) break;
  }
  return out;
}

inline std::vector<TokenId> reference_generate(std::vector<TokenId> prompt, int32_t max_tokens,
                                               int32_t vocab, std::optional<TokenId> eos,
                                               int64_t max_model_len = 1 << 30) {
  return reference_generate(std::move(prompt), max_tokens, iota_alphabet(vocab), eos,
                            max_model_len);
}

class FakeExecutor final : public Executor {
 public:
  FakeExecutor(int32_t num_blocks, int32_t block_size, int32_t vocab)
      : FakeExecutor(num_blocks, block_size, iota_alphabet(vocab)) {}
  FakeExecutor(int32_t num_blocks, int32_t block_size, std::vector<TokenId> alphabet)
      : block_size_(block_size),
        alphabet_(std::move(alphabet)),
        slots_(static_cast<size_t>(num_blocks) * block_size, -1) {}

  // Test hooks: fail the next execute() calls; block execute() until released.
  void fail_next(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_next_ = n;
  }
  void hold(bool on) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hold_ = on;
    }
    released_.notify_all();
  }

  // Whether execute() is waiting in hold() now (the engine thread is inside a step).
  bool holding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return holding_;
  }

  Result<StepResult> execute(const StepPlan& plan) override {
    std::unique_lock<std::mutex> lock(mutex_);
    holding_ = hold_;
    released_.wait_for(lock, std::chrono::seconds(30), [&] { return !hold_; });
    holding_ = false;
    ++num_steps_;
    if (fail_next_ > 0) {
      --fail_next_;
      return internal_error("injected executor failure");
    }
    max_batched_tokens_seen_ = std::max(max_batched_tokens_seen_, plan.num_batched_tokens);
    StepResult result;
    // Write every chunk's tokens (drafts included, as a model writes their KV) first, then read: a
    // chunk of this step must never write a block that another chunk of the same step reads (the
    // model's contract).
    std::vector<std::vector<int32_t>> written(plan.chunks.size());
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      const ScheduledChunk& chunk = plan.chunks[c];
      const int64_t end = chunk.start_pos + static_cast<int64_t>(chunk.tokens.size());
      if (static_cast<int64_t>(chunk.block_table.size()) * block_size_ < end) {
        return internal_error("block table too short");
      }
      for (size_t i = 0; i < chunk.tokens.size(); ++i) {
        const int64_t pos = chunk.start_pos + static_cast<int64_t>(i);
        slots_[slot(chunk.block_table[pos / block_size_], pos % block_size_)] = chunk.tokens[i];
        written[c].push_back(chunk.block_table[pos / block_size_]);
      }
    }
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      for (size_t d = 0; d < plan.chunks.size(); ++d) {
        if (c == d) continue;
        for (int32_t b : written[c]) {
          const auto& table = plan.chunks[d].block_table;
          if (std::find(table.begin(), table.end(), b) != table.end()) {
            return internal_error("a block written by one chunk is used by another chunk");
          }
        }
      }
    }
    for (const ScheduledChunk& chunk : plan.chunks) {
      ChunkResult& outcome = result.chunks.emplace_back();
      if (chunk.prompt_logprobs >= 0) {
        // The row at position pos describes the prompt token after it; its logprob names pos.
        const int64_t end = std::min(chunk.start_pos + chunk.num_known_tokens(),
                                     static_cast<int64_t>(chunk.prompt.size()) - 1);
        for (int64_t pos = std::max(chunk.start_pos, chunk.prompt_logprobs_from); pos < end;
             ++pos) {
          outcome.prompt_logprobs.push_back(
              {chunk.prompt[static_cast<size_t>(pos + 1)], -static_cast<float>(pos + 1), 1, {}});
        }
      }
      if (!chunk.sample) continue;
      // The context up to the last known token, read back through the block table.
      const int64_t end = chunk.start_pos + chunk.num_known_tokens();
      std::vector<TokenId> context(end);
      for (int64_t pos = 0; pos < end; ++pos) {
        context[pos] = slots_[slot(chunk.block_table[pos / block_size_], pos % block_size_)];
      }
      // Verification: a draft is accepted when it is the token the fake model would produce;
      // the first rejected one is replaced by that token.
      for (size_t j = 0; j <= chunk.drafts.size(); ++j) {
        SampledToken sampled;
        sampled.token = fake_next_token(context, alphabet_);
        // A recognisable logprob so that tests can see it travel to the outputs.
        sampled.logprob = -0.25f;
        if (chunk.sampling != nullptr && chunk.sampling->want_logprobs) {
          for (int32_t k = 0; k < chunk.sampling->top_logprobs; ++k) {
            sampled.top_logprobs.push_back({alphabet_[k % alphabet_.size()], -1.0f - k});
          }
        }
        outcome.tokens.push_back(sampled);
        context.push_back(sampled.token);
        if (j == chunk.drafts.size() || chunk.drafts[j].token != sampled.token) break;
        ++accepted_drafts_;
      }
      proposed_drafts_ += static_cast<int64_t>(chunk.drafts.size());
      // Drafts: the fake model's own next tokens, every draft_error_every-th one wrong.
      for (int32_t j = 0; j < chunk.num_lookahead; ++j) {
        DraftToken draft;
        draft.token = fake_next_token(context, alphabet_);
        if (draft_error_every_ > 0 && ++draft_counter_ % draft_error_every_ == 0) {
          const auto at = std::find(alphabet_.begin(), alphabet_.end(), draft.token);
          draft.token =
              alphabet_[(static_cast<size_t>(at - alphabet_.begin()) + 1) % alphabet_.size()];
        }
        context.push_back(draft.token);
        outcome.drafts.push_back(draft);
      }
    }
    return result;
  }

  // Speculative decoding: every n-th draft this fake proposes is wrong (0: never).
  void set_draft_error_every(int64_t n) { draft_error_every_ = n; }
  int64_t proposed_drafts() const { return proposed_drafts_; }
  int64_t accepted_drafts() const { return accepted_drafts_; }

  // KV export/import (a caching pool): a block is its slots' token ids. A block imported
  // with wrong contents changes every later token, as wrong KV would.
  size_t kv_block_bytes() const override { return static_cast<size_t>(block_size_) * 4; }
  int64_t kv_block_tokens() const override { return block_size_; }
  Status read_kv_block(int32_t block, std::span<std::byte> out) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (out.size() != kv_block_bytes() || block < 0 ||
        slot(block, 0) + block_size_ > slots_.size()) {
      return invalid_argument("fake read_kv_block: bad block or size");
    }
    std::memcpy(out.data(), &slots_[slot(block, 0)], out.size());
    return ok_status();
  }
  Status write_kv_block(int32_t block, std::span<const std::byte> bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes.size() != kv_block_bytes() || block < 0 ||
        slot(block, 0) + block_size_ > slots_.size()) {
      return invalid_argument("fake write_kv_block: bad block or size");
    }
    std::memcpy(&slots_[slot(block, 0)], bytes.data(), bytes.size());
    return ok_status();
  }

  std::span<std::byte> kv_block_memory(int32_t block) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (block < 0 || slot(block, 0) + block_size_ > slots_.size()) return {};
    return {reinterpret_cast<std::byte*>(&slots_[slot(block, 0)]), kv_block_bytes()};
  }

  int64_t num_steps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return num_steps_;
  }
  int64_t max_batched_tokens_seen() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return max_batched_tokens_seen_;
  }

 private:
  size_t slot(int32_t block, int64_t offset) const {
    return static_cast<size_t>(block) * block_size_ + static_cast<size_t>(offset);
  }

  int32_t block_size_;
  std::vector<TokenId> alphabet_;
  std::vector<TokenId> slots_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  bool hold_ = false;
  bool holding_ = false;
  int fail_next_ = 0;
  int64_t num_steps_ = 0;
  int64_t max_batched_tokens_seen_ = 0;
  int64_t draft_error_every_ = 0;
  int64_t draft_counter_ = 0;
  int64_t proposed_drafts_ = 0;
  int64_t accepted_drafts_ = 0;
};

}  // namespace peerserve::testing
