#include "cache/dram_tier.h"

#include <cstring>
#include <new>
#include <utility>

#include "kv/kv_namespace.h"

namespace peerserve {

WriteReservation::WriteReservation(WriteReservation&& other) noexcept
    : tier_(std::exchange(other.tier_, nullptr)),
      key_(std::move(other.key_)),
      offset_(other.offset_),
      bytes_(other.bytes_) {}

WriteReservation& WriteReservation::operator=(WriteReservation&& other) noexcept {
  if (this != &other) {
    release();
    tier_ = std::exchange(other.tier_, nullptr);
    key_ = std::move(other.key_);
    offset_ = other.offset_;
    bytes_ = other.bytes_;
  }
  return *this;
}

WriteReservation::~WriteReservation() {
  release();
}

void WriteReservation::release() {
  if (tier_ != nullptr) std::exchange(tier_, nullptr)->abort_reservation(*this);
}

void WriteReservation::commit() {
  PS_CHECK(tier_ != nullptr) << "commit of an empty or committed reservation";
  std::exchange(tier_, nullptr)->commit_reservation(*this);
}

Result<std::unique_ptr<DramTier>> DramTier::create(const DramTierOptions& options) {
  if (options.capacity_bytes < ArenaAllocator::kAlignment) {
    return invalid_argument("DRAM tier: capacity " + std::to_string(options.capacity_bytes) +
                            " bytes, expected at least " +
                            std::to_string(ArenaAllocator::kAlignment));
  }
  for (const auto& [tenant, bytes] : options.tenant_capacity) {
    PS_RETURN_IF_ERROR(validate_tenant_name(tenant));
    if (bytes == 0)
      return invalid_argument("DRAM tier: capacity of namespace '" + tenant + "' is 0");
  }
  std::unique_ptr<std::byte[]> arena;
  try {
    // Not value-initialised: the kernel commits pages only when blocks are first written.
    arena = std::make_unique_for_overwrite<std::byte[]>(options.capacity_bytes);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("DRAM tier: cannot allocate an arena of " +
                              std::to_string(options.capacity_bytes) + " bytes");
  }
  return std::make_unique<DramTier>(ConstructionKey{}, options, std::move(arena));
}

DramTier::DramTier(ConstructionKey, const DramTierOptions& options,
                   std::unique_ptr<std::byte[]> arena)
    : options_(options), arena_(std::move(arena)), allocator_(options.capacity_bytes) {
  counters_.capacity_bytes = allocator_.capacity();
}

DramTier::~DramTier() {
  std::lock_guard lock(mutex_);
  PS_CHECK(zombies_.empty()) << "DRAM tier destroyed while a read is in progress";
}

void DramTier::drop(EntryList::iterator it, EntryList& list) {
  allocator_.release(it->offset, it->size);
  auto used = tenant_used_.find(it->key.tenant);
  used->second -= it->size;
  if (used->second == 0) tenant_used_.erase(used);
  list.erase(it);
}

bool DramTier::evict_one(const std::string* tenant) {
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    if (it->pins > 0) continue;
    if (tenant != nullptr && it->key.tenant != *tenant) continue;
    index_.erase(it->key);
    drop(it, lru_);
    ++counters_.evictions;
    return true;
  }
  return false;
}

Result<WriteReservation> DramTier::reserve(const PoolKey& key, size_t size) {
  PS_RETURN_IF_ERROR(validate_pool_key(key));
  if (size == 0) return invalid_argument("DRAM tier: block " + to_string(key) + " is empty");
  if (ArenaAllocator::rounded(size) > allocator_.capacity()) {
    return invalid_argument("DRAM tier: block " + to_string(key) + " is " + std::to_string(size) +
                            " bytes, larger than the tier (" +
                            std::to_string(allocator_.capacity()) + " bytes)");
  }
  std::lock_guard lock(mutex_);
  auto quota = options_.tenant_capacity.find(key.tenant);
  if (quota != options_.tenant_capacity.end()) {
    if (size > quota->second) {
      return invalid_argument("DRAM tier: block " + to_string(key) + " is " + std::to_string(size) +
                              " bytes, larger than the namespace's capacity (" +
                              std::to_string(quota->second) + " bytes)");
    }
    while (tenant_used_[key.tenant] + size > quota->second) {
      if (!evict_one(&key.tenant)) {
        return resource_exhausted("DRAM tier: namespace '" + key.tenant +
                                  "' is full of blocks being read or written");
      }
    }
  }
  std::optional<uint64_t> offset;
  while (!(offset = allocator_.allocate(size))) {
    if (!evict_one(nullptr)) {
      return resource_exhausted("DRAM tier: no room for " + std::to_string(size) +
                                " bytes; the tier is full of blocks being read or written");
    }
  }
  tenant_used_[key.tenant] += size;
  WriteReservation reservation;
  reservation.tier_ = this;
  reservation.key_ = key;
  reservation.offset_ = *offset;
  reservation.bytes_ = std::span<std::byte>(arena_.get() + *offset, size);
  return reservation;
}

void DramTier::commit_reservation(WriteReservation& reservation) {
  std::lock_guard lock(mutex_);
  auto existing = index_.find(reservation.key_);
  if (existing != index_.end()) {
    EntryList::iterator old = existing->second;
    index_.erase(existing);
    if (old->pins > 0) {
      old->dead = true;
      zombies_.splice(zombies_.begin(), lru_, old);
    } else {
      drop(old, lru_);
    }
  }
  lru_.push_front(Entry{
      .key = reservation.key_, .offset = reservation.offset_, .size = reservation.bytes_.size()});
  index_.emplace(reservation.key_, lru_.begin());
  counters_.bytes_written += reservation.bytes_.size();
}

void DramTier::abort_reservation(WriteReservation& reservation) {
  std::lock_guard lock(mutex_);
  allocator_.release(reservation.offset_, reservation.bytes_.size());
  auto used = tenant_used_.find(reservation.key_.tenant);
  used->second -= reservation.bytes_.size();
  if (used->second == 0) tenant_used_.erase(used);
}

Status DramTier::put(const PoolKey& key, std::span<const std::byte> bytes) {
  PS_ASSIGN_OR_RETURN(WriteReservation reservation, reserve(key, bytes.size()));
  std::memcpy(reservation.bytes().data(), bytes.data(), bytes.size());
  reservation.commit();
  return ok_status();
}

Result<bool> DramTier::get(const PoolKey& key, const BlockSink& sink) {
  EntryList::iterator it;
  {
    std::lock_guard lock(mutex_);
    auto found = index_.find(key);
    if (found == index_.end()) {
      ++counters_.misses;
      return false;
    }
    it = found->second;
    lru_.splice(lru_.begin(), lru_, it);  // most recently used
    ++it->pins;
  }
  // Copy outside the lock; the pin keeps the bytes in place.
  const std::span<std::byte> dst = sink(it->size);
  const bool size_ok = dst.size() == it->size;
  if (size_ok) std::memcpy(dst.data(), arena_.get() + it->offset, it->size);
  const uint64_t size = it->size;
  unpin(it);
  if (!size_ok) {
    return invalid_argument("cache block " + to_string(key) + " is " + std::to_string(size) +
                            " bytes, the destination " + std::to_string(dst.size()));
  }
  std::lock_guard lock(mutex_);
  ++counters_.hits;
  counters_.bytes_read += size;
  return true;
}

void DramTier::unpin(EntryList::iterator it) {
  std::lock_guard lock(mutex_);
  if (--it->pins == 0 && it->dead) drop(it, zombies_);
}

std::optional<uint64_t> DramTier::size_of(const PoolKey& key) const {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return std::nullopt;
  return found->second->size;
}

bool DramTier::remove(const PoolKey& key) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return false;
  EntryList::iterator it = found->second;
  index_.erase(found);
  if (it->pins > 0) {
    it->dead = true;
    zombies_.splice(zombies_.begin(), lru_, it);
  } else {
    drop(it, lru_);
  }
  return true;
}

TierStats DramTier::stats() const {
  std::lock_guard lock(mutex_);
  TierStats s = counters_;
  s.used_bytes = allocator_.allocated_bytes();
  s.blocks = index_.size();
  s.tenant_used_bytes = tenant_used_;
  return s;
}

}  // namespace peerserve
