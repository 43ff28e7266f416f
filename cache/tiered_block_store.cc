#include "cache/tiered_block_store.h"

#include <cstring>

namespace peerserve {

Result<std::unique_ptr<TieredBlockStore>> TieredBlockStore::open(
    const TieredBlockStoreOptions& options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DramTier> dram,
                      DramTier::create({.capacity_bytes = options.dram_bytes,
                                        .tenant_capacity = options.tenant_capacity}));
  std::unique_ptr<SsdTier> ssd;
  if (!options.ssd_dir.empty()) {
    PS_ASSIGN_OR_RETURN(ssd, SsdTier::open({.dir = options.ssd_dir,
                                            .capacity_bytes = options.ssd_bytes,
                                            .tenant_capacity = options.tenant_capacity,
                                            .sync_writes = options.ssd_sync_writes}));
  }
  return std::make_unique<TieredBlockStore>(ConstructionKey{}, std::move(dram), std::move(ssd));
}

TieredBlockStore::TieredBlockStore(ConstructionKey, std::unique_ptr<DramTier> dram,
                                   std::unique_ptr<SsdTier> ssd)
    : dram_(std::move(dram)), ssd_(std::move(ssd)) {}

TieredBlockStore::Stripe& TieredBlockStore::stripe_of(const PoolKey& key) {
  return stripes_[(key.hash ^ std::hash<std::string>{}(key.tenant)) % kStripes];
}

Status TieredBlockStore::put(const PoolKey& key, std::span<const std::byte> bytes) {
  ++puts_;
  if (ssd_ == nullptr) {
    Status status = dram_->put(key, bytes);
    if (!status.ok()) {
      ++put_errors_;
      dram_->remove(key);  // no older version may outlive a refused write
    }
    return status;
  }
  Stripe& stripe = stripe_of(key);
  std::lock_guard writer(stripe.writer);
  Status status = ssd_->put(key, bytes);
  std::lock_guard lock(stripe.mutex);
  ++stripe.writes;  // a read of the older file under way must not promote it
  if (!status.ok()) {
    ++put_errors_;
    // Neither tier keeps a block that the SSD tier refused, so a later get cannot return a
    // stale older version.
    dram_->remove(key);
    ssd_->remove(key);
    return status;
  }
  // Persisted: DRAM is only a faster copy. A block DRAM cannot take (larger than the tier,
  // or the tier full of blocks being read) is served from SSD.
  if (!dram_->put(key, bytes).ok()) dram_->remove(key);
  return ok_status();
}

Result<bool> TieredBlockStore::get(const PoolKey& key, const BlockSink& sink) {
  ++gets_;
  PS_ASSIGN_OR_RETURN(bool hit, dram_->get(key, sink));
  if (!hit && ssd_ != nullptr) {
    Stripe& stripe = stripe_of(key);
    uint64_t writes_before = 0;
    {
      std::lock_guard lock(stripe.mutex);
      writes_before = stripe.writes;
    }
    std::span<std::byte> landed;
    PS_ASSIGN_OR_RETURN(hit, ssd_->get(key, [&](size_t size) { return landed = sink(size); }));
    // Promote: the next read of this block is served from memory. Best effort: a DRAM tier
    // full of pinned blocks just leaves it on SSD. Not after a write of the stripe.
    if (hit) {
      std::lock_guard lock(stripe.mutex);
      if (stripe.writes == writes_before) (void)dram_->put(key, landed);
    }
  }
  if (hit) ++hits_;
  return hit;
}

std::optional<uint64_t> TieredBlockStore::size_of(const PoolKey& key) const {
  std::optional<uint64_t> size = dram_->size_of(key);
  if (!size && ssd_ != nullptr) size = ssd_->size_of(key);
  return size;
}

bool TieredBlockStore::remove(const PoolKey& key) {
  Stripe& stripe = stripe_of(key);
  std::lock_guard writer(stripe.writer);
  std::lock_guard lock(stripe.mutex);
  ++stripe.writes;
  const bool in_dram = dram_->remove(key);
  const bool in_ssd = ssd_ != nullptr && ssd_->remove(key);
  return in_dram || in_ssd;
}

PoolStats TieredBlockStore::stats() const {
  PoolStats s;
  s.dram = dram_->stats();
  if (ssd_ != nullptr) s.ssd = ssd_->stats();
  s.gets = gets_.load();
  s.hits = hits_.load();
  s.misses = s.gets - s.hits;
  s.puts = puts_.load();
  s.put_errors = put_errors_.load();
  return s;
}

}  // namespace peerserve
