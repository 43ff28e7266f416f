// Helpers for driving DeepseekModel in tests: sequences with their own block ids.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/check.h"
#include "model/deepseek_model.h"

namespace peerserve::testing {

// A sequence: every token so far, how many are in the cache, and its block table.
struct TestSequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t cached = 0;

  // The chunk of the next n uncached tokens.
  SequenceChunk next_chunk(int64_t n, bool all_logits) const {
    SequenceChunk c;
    c.tokens = std::span<const int32_t>(tokens).subspan(cached, n);
    c.start_pos = cached;
    c.block_table = blocks;
    c.all_logits = all_logits;
    return c;
  }
};

inline std::unique_ptr<DeepseekModel> load_model(const std::string& dir, ModelOptions options) {
  auto model = DeepseekModel::load(dir, options);
  PS_CHECK(model.ok()) << model.status().to_string();
  return std::move(model).value();
}

inline LatentKvCache make_cache(const DeepseekModel& model, int64_t block_size, DType dtype,
                                int64_t num_blocks) {
  auto cache = LatentKvCache::create(model.kv_layout(block_size, dtype), num_blocks);
  PS_CHECK(cache.ok()) << cache.status().to_string();
  return std::move(cache).value();
}

// Deterministic token ids in [2, vocab).
inline std::vector<int32_t> test_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> out(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& t : out) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<int32_t>(2 + (s >> 8) % static_cast<uint32_t>(vocab - 2));
  }
  return out;
}

// max |a - b| / max |a|: a relative error on the scale of the logits.
inline double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  PS_CHECK_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(a[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Logits of every position of one sequence prefilled in one step (blocks of 16, BF16 KV).
inline std::vector<float> sequence_logits(DeepseekModel& model,
                                          const std::vector<int32_t>& tokens) {
  LatentKvCache cache = make_cache(model, 16, DType::kBF16, 8);
  std::vector<int32_t> table;
  for (int32_t b = 0; b * 16 < static_cast<int32_t>(tokens.size()); ++b) table.push_back(b);
  std::vector<SequenceChunk> chunks(1);
  chunks[0].tokens = tokens;
  chunks[0].block_table = table;
  chunks[0].all_logits = true;
  ForwardOutput out;
  PS_CHECK(model.forward(chunks, cache, &out).ok());
  return out.logits;
}

}  // namespace peerserve::testing
