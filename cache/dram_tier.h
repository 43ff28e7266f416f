// DramTier: the memory tier of a cache server. One arena of fixed capacity (allocated once,
// pages committed as they are first written), variable-size blocks placed by
// ArenaAllocator, least-recently-used eviction.
//
// Writes are two-phase: reserve() takes space (evicting as needed) and returns a
// WriteReservation whose bytes the caller fills (e.g. straight from a network buffer); only
// commit() publishes the block. A reader never sees a reservation, so it never sees a
// half-written block. A reservation dropped without commit() gives its space back. Two
// writers of the same key each fill their own reservation; the later commit replaces the
// earlier block, and a reader holding the earlier one finishes its copy from it first.
//
// Reads pin the block, copy it into the caller's sink outside the lock, then unpin: a
// pinned block is never evicted or reused, so concurrent reads copy in parallel and the
// copy into the sink is the only one.
//
// Per-tenant capacity (optional): a tenant over its quota evicts its own least recently
// used blocks, never another tenant's.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "cache/arena_allocator.h"
#include "cache/block_sink.h"
#include "cache/pool_key.h"
#include "cache/tier_stats.h"

namespace peerserve {

struct DramTierOptions {
  uint64_t capacity_bytes = 0;                      // required, > 0
  std::map<std::string, uint64_t> tenant_capacity;  // optional per-tenant limits
};

class DramTier;

// Space reserved for one block; see DramTier::reserve. Move-only; aborts on destruction
// unless committed.
class WriteReservation {
 public:
  WriteReservation() = default;
  WriteReservation(WriteReservation&& other) noexcept;
  WriteReservation& operator=(WriteReservation&& other) noexcept;
  ~WriteReservation();

  std::span<std::byte> bytes() const { return bytes_; }
  const PoolKey& key() const { return key_; }
  // Publishes the block (replacing an older block of the same key). Consumes the reservation.
  void commit();

 private:
  friend class DramTier;
  void release();

  DramTier* tier_ = nullptr;
  PoolKey key_;
  uint64_t offset_ = 0;
  std::span<std::byte> bytes_;
};

class DramTier {
  struct ConstructionKey {};

 public:
  // Errors: capacity 0, or an arena that cannot be allocated.
  static Result<std::unique_ptr<DramTier>> create(const DramTierOptions& options);
  DramTier(ConstructionKey, const DramTierOptions& options, std::unique_ptr<std::byte[]> arena);
  ~DramTier();
  DramTier(const DramTier&) = delete;
  DramTier& operator=(const DramTier&) = delete;

  // Reserves `size` bytes for `key`, evicting least recently used blocks (of the key's tenant
  // first when it is over its quota). Errors: InvalidArgument for size 0, a block larger
  // than the tier or the tenant's quota, or a bad tenant name; ResourceExhausted when pinned
  // blocks and writes in progress leave no room.
  Result<WriteReservation> reserve(const PoolKey& key, size_t size);
  // reserve + copy + commit.
  Status put(const PoolKey& key, std::span<const std::byte> bytes);

  // Copies the block into sink(size). Returns false on a miss. Errors only from a sink that
  // returns a span of the wrong size.
  Result<bool> get(const PoolKey& key, const BlockSink& sink);
  // Size of the stored block, or nullopt. Does not count as a hit or touch the LRU order.
  std::optional<uint64_t> size_of(const PoolKey& key) const;
  // Drops the block; false if it was not there.
  bool remove(const PoolKey& key);

  TierStats stats() const;

 private:
  friend class WriteReservation;
  struct Entry {
    PoolKey key;
    uint64_t offset = 0;
    uint64_t size = 0;
    int pins = 0;
    bool dead = false;  // removed or replaced while pinned: freed at the last unpin
  };
  using EntryList = std::list<Entry>;

  // Evicts the least recently used unpinned block (of `tenant` only, if given). False if none.
  bool evict_one(const std::string* tenant);
  // Frees the entry's bytes (lock held); unlinks it from whichever list holds it.
  void drop(EntryList::iterator it, EntryList& list);
  void commit_reservation(WriteReservation& reservation);
  void abort_reservation(WriteReservation& reservation);
  void unpin(EntryList::iterator it);

  DramTierOptions options_;
  std::unique_ptr<std::byte[]> arena_;
  mutable std::mutex mutex_;
  ArenaAllocator allocator_;
  EntryList lru_;      // front = most recently used
  EntryList zombies_;  // dead but still pinned by a reader
  std::unordered_map<PoolKey, EntryList::iterator, PoolKeyHasher> index_;
  std::map<std::string, uint64_t> tenant_used_;  // includes reservations
  TierStats counters_;
};

}  // namespace peerserve
