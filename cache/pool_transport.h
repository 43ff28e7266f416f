// PoolTransport: how a client reaches one member of the caching pool. This is the seam
// between the client SDK (PoolClient: placement, fan-out, fault handling) and a wire:
// LocalPoolTransport calls a TieredBlockStore in the same process (`--kv-pool local`),
// GrpcPoolTransport talks to a `peerserve cache-server` over gRPC streams. A UCX data path
// would be a third implementation (its get/put over UCX, the rest over gRPC).
//
// Contract for every implementation:
// - Every call returns by `deadline`; a member that is down or too slow yields
//   StatusCode::kUnavailable, never a hang.
// - get() reports each block separately; a block is a hit only if all of its bytes were
//   copied into its sink. A call cut off half-way leaves the complete blocks as hits and marks
//   the rest as errors, whose sinks may hold part of a block (the block stream receives
//   straight into them): a caller uses only the bytes of hits.
// - Malformed replies from a member are errors, never a crash.
//
// Thread-safety: implementations are safe to call from several threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cache/block_sink.h"
#include "cache/pool_key.h"
#include "cache/tiered_block_store.h"

namespace peerserve {

using PoolClock = std::chrono::steady_clock;
using PoolDeadline = PoolClock::time_point;

// The outcome of reading one block.
struct BlockLookup {
  enum class Kind : uint8_t { kHit, kMiss, kError };
  Kind kind = Kind::kMiss;
  Status error;  // set when kind == kError

  bool hit() const { return kind == Kind::kHit; }
  static BlockLookup hit_result() { return {Kind::kHit, ok_status()}; }
  static BlockLookup miss() { return {Kind::kMiss, ok_status()}; }
  static BlockLookup failed(Status status) { return {Kind::kError, std::move(status)}; }
};

class PoolTransport {
 public:
  virtual ~PoolTransport() = default;

  // "local", or the member's "host:port".
  virtual const std::string& name() const = 0;

  // Reads keys[i] into sinks[i]. Returns one outcome per key; when the call itself fails,
  // every block not yet read is an error carrying the call's status.
  // REQUIRES: keys.size() == sinks.size().
  virtual std::vector<BlockLookup> get(std::span<const PoolKey> keys,
                                       std::span<const BlockSink> sinks, PoolDeadline deadline) = 0;
  // Stores blocks[i] under keys[i]; one status per block.
  // REQUIRES: keys.size() == blocks.size().
  virtual std::vector<Status> put(std::span<const PoolKey> keys,
                                  std::span<const std::span<const std::byte>> blocks,
                                  PoolDeadline deadline) = 0;
  // Payload size per key, nullopt where absent.
  virtual Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey> keys,
                                                              PoolDeadline deadline) = 0;
  // Per key: whether it was stored before.
  virtual Result<std::vector<bool>> remove(std::span<const PoolKey> keys,
                                           PoolDeadline deadline) = 0;
  virtual Result<PoolStats> stats(PoolDeadline deadline) = 0;
};

}  // namespace peerserve
