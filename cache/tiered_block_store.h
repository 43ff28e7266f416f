// TieredBlockStore: what one cache server stores: a DRAM tier over an optional SSD tier.
//
// put() writes through: the block goes to DRAM and, when there is an SSD tier, to SSD
// before put() returns, so every acknowledged block survives a restart of the server (as
// long as the SSD tier has not evicted it). DRAM evicts by its own LRU; an evicted block
// stays on SSD. get() reads DRAM first, then SSD (verified by checksum), and promotes an SSD
// hit back into DRAM, unless the key was written or removed while it read.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "base/status.h"
#include "cache/block_sink.h"
#include "cache/dram_tier.h"
#include "cache/pool_key.h"
#include "cache/ssd_tier.h"

namespace peerserve {

struct TieredBlockStoreOptions {
  uint64_t dram_bytes = 0;  // required, > 0
  std::string ssd_dir;      // empty: no SSD tier
  uint64_t ssd_bytes = 0;   // required with ssd_dir
  bool ssd_sync_writes = false;
  std::map<std::string, uint64_t> tenant_capacity;  // per tier, optional
};

struct PoolStats {
  TierStats dram;
  std::optional<TierStats> ssd;
  uint64_t gets = 0;
  uint64_t hits = 0;  // from either tier
  uint64_t misses = 0;
  uint64_t puts = 0;
  uint64_t put_errors = 0;
};

class TieredBlockStore {
  struct ConstructionKey {};

 public:
  static Result<std::unique_ptr<TieredBlockStore>> open(const TieredBlockStoreOptions& options);
  TieredBlockStore(ConstructionKey, std::unique_ptr<DramTier> dram, std::unique_ptr<SsdTier> ssd);

  // Errors as SsdTier::put when there is an SSD tier (a block it rejects is dropped from
  // DRAM too: an acknowledged block is a persisted block; a block DRAM cannot take is served
  // from SSD), else as DramTier::put.
  Status put(const PoolKey& key, std::span<const std::byte> bytes);
  // True on a hit (the block was copied into sink(size)).
  Result<bool> get(const PoolKey& key, const BlockSink& sink);
  std::optional<uint64_t> size_of(const PoolKey& key) const;
  // Removes from both tiers; true if either held it.
  bool remove(const PoolKey& key);

  PoolStats stats() const;
  bool has_ssd() const { return ssd_ != nullptr; }
  const SsdTier* ssd() const { return ssd_.get(); }

 private:
  // Writes of the keys of one stripe, counted. A read served from SSD promotes its bytes
  // into DRAM only if no put or remove of its stripe came between the start of the read and
  // the promotion (both under the stripe's mutex): else the older bytes could overwrite a
  // newer write, or bring back a removed block.
  // Puts and removes of one stripe's keys (with an SSD tier) also hold `writer` from the SSD
  // write to the DRAM copy, so that both tiers end with the same one of two concurrent puts of
  // a key (the SSD write ran outside any lock: DRAM could keep the older, SSD the newer), and
  // a remove cannot fall between a put's two tiers. Reads never take it.
  struct Stripe {
    std::mutex writer;
    std::mutex mutex;
    uint64_t writes = 0;  // guarded by mutex
  };
  static constexpr size_t kStripes = 64;
  Stripe& stripe_of(const PoolKey& key);

  std::unique_ptr<DramTier> dram_;
  std::unique_ptr<SsdTier> ssd_;
  std::array<Stripe, kStripes> stripes_;
  std::atomic<uint64_t> gets_{0};
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> puts_{0};
  std::atomic<uint64_t> put_errors_{0};
};

}  // namespace peerserve
