#include "kv/block_pool.h"

#include <string>

namespace peerserve {

Result<BlockPool> BlockPool::create(const BlockPoolOptions& options) {
  if (options.num_blocks < 1) {
    return invalid_argument("KV block pool: num_blocks = " + std::to_string(options.num_blocks) +
                            ", expected >= 1 (raise the KV cache memory)");
  }
  if (options.block_size < 1) {
    return invalid_argument("KV block pool: block_size = " + std::to_string(options.block_size) +
                            ", expected >= 1");
  }
  return BlockPool(options);
}

BlockPool::BlockPool(const BlockPoolOptions& options)
    : options_(options),
      ref_counts_(options.num_blocks, 0),
      hashes_(options.num_blocks, 0),
      has_hash_(options.num_blocks, false),
      prev_(options.num_blocks, kNone),
      next_(options.num_blocks, kNone) {
  for (BlockId b = 0; b < options.num_blocks; ++b) append_free(b);
}

int32_t BlockPool::ref_count(BlockId block) const {
  PS_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  return ref_counts_[block];
}

std::vector<BlockId> BlockPool::match_prefix(std::span<const BlockHash> chain) const {
  std::vector<BlockId> blocks;
  if (!options_.enable_prefix_caching) return blocks;
  for (BlockHash hash : chain) {
    auto it = index_.find(hash);
    if (it == index_.end()) break;
    blocks.push_back(it->second);
  }
  return blocks;
}

std::optional<AllocationPlan> BlockPool::plan_allocation(std::span<const BlockId> shared,
                                                         int32_t num_new) const {
  PS_CHECK(num_new >= 0);
  // Shared blocks that are currently free leave the free list, so they cannot also be
  // handed out as new blocks.
  int32_t shared_free = 0;
  for (BlockId b : shared) {
    PS_CHECK(b >= 0 && b < num_blocks() && has_hash_[b]) << "block " << b << " is not cached";
    if (ref_counts_[b] == 0) ++shared_free;
  }
  if (num_free_ - shared_free < num_new) return std::nullopt;
  AllocationPlan plan;
  plan.shared.assign(shared.begin(), shared.end());
  plan.num_new = num_new;
  plan.pool_version = version_;
  return plan;
}

std::vector<BlockId> BlockPool::commit(const AllocationPlan& plan) {
  PS_CHECK_EQ(plan.pool_version, version_) << "allocation plan made against an older pool state";
  ++version_;
  for (BlockId b : plan.shared) {
    if (ref_counts_[b] == 0) unlink_free(b);
    ++ref_counts_[b];
  }
  std::vector<BlockId> fresh;
  fresh.reserve(plan.num_new);
  for (int32_t i = 0; i < plan.num_new; ++i) {
    const BlockId b = free_head_;
    PS_CHECK(b != kNone) << "free list exhausted despite a valid plan";
    unlink_free(b);
    if (has_hash_[b]) evict(b);
    ref_counts_[b] = 1;
    fresh.push_back(b);
  }
  return fresh;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  ++version_;
  for (BlockId b : blocks) {
    PS_CHECK(b >= 0 && b < num_blocks()) << "block " << b;
    PS_CHECK(ref_counts_[b] > 0) << "double release of block " << b;
    // The tail is the most recently released end: the head is reused (evicted) first.
    if (--ref_counts_[b] == 0) append_free(b);
  }
}

bool BlockPool::publish(BlockId block, BlockHash hash) {
  PS_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  PS_CHECK(ref_counts_[block] > 0) << "publishing free block " << block;
  if (!options_.enable_prefix_caching || has_hash_[block]) return false;
  auto [it, inserted] = index_.emplace(hash, block);
  if (!inserted) return false;
  ++version_;
  hashes_[block] = hash;
  has_hash_[block] = true;
  return true;
}

void BlockPool::record_lookup(int64_t query_tokens, int64_t hit_tokens) {
  // Without caching nothing was looked up (vLLM records no query either): a 0% hit rate
  // over every prompt would read as a cache that misses.
  if (!options_.enable_prefix_caching) return;
  counters_.prefix_query_tokens += query_tokens;
  counters_.prefix_hit_tokens += hit_tokens;
}

void BlockPool::drop_free_cached_blocks() {
  ++version_;
  for (BlockId b = free_head_; b != kNone; b = next_[b]) {
    if (has_hash_[b]) evict(b);
  }
}

void BlockPool::unlink_free(BlockId block) {
  const BlockId p = prev_[block];
  const BlockId n = next_[block];
  if (p == kNone) {
    free_head_ = n;
  } else {
    next_[p] = n;
  }
  if (n == kNone) {
    free_tail_ = p;
  } else {
    prev_[n] = p;
  }
  prev_[block] = next_[block] = kNone;
  --num_free_;
}

void BlockPool::append_free(BlockId block) {
  prev_[block] = free_tail_;
  next_[block] = kNone;
  if (free_tail_ == kNone) {
    free_head_ = block;
  } else {
    next_[free_tail_] = block;
  }
  free_tail_ = block;
  ++num_free_;
}

void BlockPool::evict(BlockId block) {
  index_.erase(hashes_[block]);
  has_hash_[block] = false;
  ++counters_.evictions;
}

}  // namespace peerserve
