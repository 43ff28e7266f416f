// BlockPool: the fixed set of KV block ids, their reference counts, the free list in LRU
// order and the prefix-cache index (block hash -> block id).
//
// A block is either in use (ref_count > 0) or free (ref_count == 0, on the free list). A
// free block may still be *cached*: it keeps its hash and its KV contents until the free
// list hands it out again, at which point it is evicted from the index. So "free" counts
// cached-but-unreferenced blocks too, and eviction is lazy and LRU: blocks released longest
// ago are reused first.
//
// Changes are two-phase (plan, then commit or drop the plan): plan_allocation() works out
// which cached blocks to share and whether the free list can supply the new ones without
// touching anything; commit() applies it. A plan is only valid against the state it was
// made from (checked with a version number), so plan and commit must be adjacent.
//
// Thread-safety: none; one owner (the scheduler) calls everything.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/prefix_hash.h"

namespace peerserve {

using BlockId = int32_t;

struct BlockPoolOptions {
  int32_t num_blocks = 0;             // Default: none; must be >= 1.
  int32_t block_size = 16;            // Tokens per block. Default 16.
  bool enable_prefix_caching = true;  // Default: on. Off: publish() is a no-op.
};

struct BlockPoolCounters {
  int64_t prefix_query_tokens = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of those, found cached
  int64_t evictions = 0;            // cached blocks reused for something else
};

// An allocation worked out against a given pool state; see BlockPool::plan_allocation.
struct AllocationPlan {
  std::vector<BlockId> shared;  // cached blocks to take a reference on, in order
  int32_t num_new = 0;          // fresh blocks to take from the free list
  uint64_t pool_version = 0;    // state the plan was made against
};

class BlockPool {
 public:
  // Errors: num_blocks < 1 or block_size < 1.
  static Result<BlockPool> create(const BlockPoolOptions& options);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t block_size() const { return options_.block_size; }
  bool prefix_caching_enabled() const { return options_.enable_prefix_caching; }
  // Blocks with ref_count == 0 (including cached ones that are evictable).
  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_used_blocks() const { return num_blocks() - num_free_; }
  // Blocks present in the hash index (used or free).
  int32_t num_cached_blocks() const { return static_cast<int32_t>(index_.size()); }
  int32_t ref_count(BlockId block) const;
  const BlockPoolCounters& counters() const { return counters_; }

  // The blocks cached under the longest leading run of `chain`. Pure.
  std::vector<BlockId> match_prefix(std::span<const BlockHash> chain) const;

  // Plans sharing `shared` (blocks from match_prefix(), still cached) plus taking `num_new`
  // blocks off the free list. nullopt when the free list is too short. Pure.
  std::optional<AllocationPlan> plan_allocation(std::span<const BlockId> shared,
                                                int32_t num_new) const;
  // Applies a plan made against the current state and returns the new blocks, in order.
  // Taking a cached free block evicts it from the index.
  std::vector<BlockId> commit(const AllocationPlan& plan);

  // Drops one reference from each block. Blocks reaching zero join the tail of the free list
  // in the given order, so pass a sequence's blocks last-first to keep its prefix longest.
  void release(std::span<const BlockId> blocks);

  // Records that `block` (in use, fully written) holds the tokens hashed by `hash`. Returns
  // false (and changes nothing) if caching is off, the block is already published, or
  // another block holds that hash.
  bool publish(BlockId block, BlockHash hash);

  // Counts a prefix-cache lookup (for the hit-rate metric); nothing when caching is off.
  void record_lookup(int64_t query_tokens, int64_t hit_tokens);

  // Forgets every cached hash of free blocks (e.g. after the KV contents were lost).
  void drop_free_cached_blocks();

 private:
  explicit BlockPool(const BlockPoolOptions& options);

  void unlink_free(BlockId block);
  void append_free(BlockId block);
  void evict(BlockId block);

  static constexpr BlockId kNone = -1;

  BlockPoolOptions options_;
  std::vector<int32_t> ref_counts_;
  std::vector<BlockHash> hashes_;  // valid where has_hash_
  std::vector<bool> has_hash_;
  // Free list: doubly linked through prev_/next_, head = least recently released.
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  BlockId free_head_ = kNone;
  BlockId free_tail_ = kNone;
  int32_t num_free_ = 0;
  std::unordered_map<BlockHash, BlockId> index_;
  BlockPoolCounters counters_;
  uint64_t version_ = 0;
};

}  // namespace peerserve
