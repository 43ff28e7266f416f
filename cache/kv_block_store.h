// KvBlockStore: what an engine sees of the caching pool: put/get/exists/remove of blocks by
// PoolKey, batched, each call bounded by a timeout, plus asynchronous forms so that the step
// loop never waits on the network. The engine does not know whether the pool is in-process
// or remote; PoolClient implements this over any PoolTransport, and tests may fake it.
//
// Failure model: a block that cannot be read for any reason the engine cannot fix (absent,
// evicted, corrupt on SSD, its member down or too slow) is a miss, and the engine recomputes
// it. Errors are kept for misuse (a destination of the wrong size, an invalid tenant).
//
// Thread-safety: implementations are safe to call from several threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "cache/block_sink.h"
#include "cache/pool_key.h"
#include "cache/pool_transport.h"

namespace peerserve {

class KvBlockStore {
 public:
  virtual ~KvBlockStore() = default;

  // Reads keys[i] into sinks[i]; one outcome per key. Returns within `timeout`.
  virtual std::vector<BlockLookup> get(std::span<const PoolKey> keys,
                                       std::span<const BlockSink> sinks,
                                       std::chrono::milliseconds timeout) = 0;
  // Stores blocks[i] under keys[i]; one status per block (kUnavailable: member down).
  virtual std::vector<Status> put(std::span<const PoolKey> keys,
                                  std::span<const std::span<const std::byte>> blocks,
                                  std::chrono::milliseconds timeout) = 0;
  // Payload size per key, nullopt where absent or its member is unreachable.
  virtual std::vector<std::optional<uint64_t>> exists(std::span<const PoolKey> keys,
                                                      std::chrono::milliseconds timeout) = 0;
  // Per key: whether a stored block was removed.
  virtual std::vector<bool> remove(std::span<const PoolKey> keys,
                                   std::chrono::milliseconds timeout) = 0;

  // get() on a background thread. The sinks (and the buffers they write) must stay valid
  // until the future is ready.
  virtual std::future<std::vector<BlockLookup>> get_async(std::vector<PoolKey> keys,
                                                          std::vector<BlockSink> sinks,
                                                          std::chrono::milliseconds timeout) = 0;
  // put() of blocks the call owns, on a background thread. When too many writes are queued
  // the future is ready at once with kResourceExhausted for every block (writes are best
  // effort; the engine must never block on them).
  virtual std::future<std::vector<Status>> put_async(std::vector<PoolKey> keys,
                                                     std::vector<std::vector<std::byte>> blocks,
                                                     std::chrono::milliseconds timeout) = 0;
};

}  // namespace peerserve
