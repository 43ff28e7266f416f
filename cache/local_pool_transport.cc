#include "cache/local_pool_transport.h"

namespace peerserve {

LocalPoolTransport::LocalPoolTransport(std::shared_ptr<TieredBlockStore> store)
    : store_(std::move(store)) {
  PS_CHECK(store_ != nullptr);
}

std::vector<BlockLookup> LocalPoolTransport::get(std::span<const PoolKey> keys,
                                                 std::span<const BlockSink> sinks, PoolDeadline) {
  PS_CHECK_EQ(keys.size(), sinks.size());
  std::vector<BlockLookup> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    Status key_status = validate_pool_key(keys[i]);
    if (!key_status.ok()) {
      out.push_back(BlockLookup::failed(std::move(key_status)));
      continue;
    }
    Result<bool> hit = store_->get(keys[i], sinks[i]);
    if (!hit.ok()) {
      out.push_back(BlockLookup::failed(hit.status()));
    } else {
      out.push_back(*hit ? BlockLookup::hit_result() : BlockLookup::miss());
    }
  }
  return out;
}

std::vector<Status> LocalPoolTransport::put(std::span<const PoolKey> keys,
                                            std::span<const std::span<const std::byte>> blocks,
                                            PoolDeadline) {
  PS_CHECK_EQ(keys.size(), blocks.size());
  std::vector<Status> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out.push_back(store_->put(keys[i], blocks[i]));
  return out;
}

Result<std::vector<std::optional<uint64_t>>> LocalPoolTransport::exists(
    std::span<const PoolKey> keys, PoolDeadline) {
  std::vector<std::optional<uint64_t>> out;
  out.reserve(keys.size());
  for (const PoolKey& key : keys) out.push_back(store_->size_of(key));
  return out;
}

Result<std::vector<bool>> LocalPoolTransport::remove(std::span<const PoolKey> keys, PoolDeadline) {
  std::vector<bool> out;
  out.reserve(keys.size());
  for (const PoolKey& key : keys) out.push_back(store_->remove(key));
  return out;
}

Result<PoolStats> LocalPoolTransport::stats(PoolDeadline) {
  return store_->stats();
}

}  // namespace peerserve
