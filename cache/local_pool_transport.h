// LocalPoolTransport: a pool member in the same process (the embedded default,
// `--kv-pool local`): calls go straight to a TieredBlockStore, with no network and no copy
// beyond the one into the caller's buffer. Deadlines are not needed: every call is bounded
// by memory copies and, with an SSD tier, local file I/O.
#pragma once

#include <memory>
#include <string>

#include "cache/pool_transport.h"
#include "cache/tiered_block_store.h"

namespace peerserve {

class LocalPoolTransport final : public PoolTransport {
 public:
  explicit LocalPoolTransport(std::shared_ptr<TieredBlockStore> store);

  const std::string& name() const override { return name_; }
  std::vector<BlockLookup> get(std::span<const PoolKey> keys, std::span<const BlockSink> sinks,
                               PoolDeadline deadline) override;
  std::vector<Status> put(std::span<const PoolKey> keys,
                          std::span<const std::span<const std::byte>> blocks,
                          PoolDeadline deadline) override;
  Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey> keys,
                                                      PoolDeadline deadline) override;
  Result<std::vector<bool>> remove(std::span<const PoolKey> keys, PoolDeadline deadline) override;
  Result<PoolStats> stats(PoolDeadline deadline) override;

 private:
  std::shared_ptr<TieredBlockStore> store_;
  std::string name_ = "local";
};

}  // namespace peerserve
