// BlockStreamBackend: what a block-stream server (cache/block_stream_server.h) serves — the
// caching pool's tiered store on a cache server, or the KV blocks a decode instance reserved
// for a prefill instance's hand-off (runtime/kv_handoff_receiver.h).
//
// A put is two-phase so that a block can be received straight into its final place:
// begin_put() names where the block's bytes go (or refuses the block), the server reads them
// there, and end_put() says whether all of them arrived. Every begin_put() that returned a
// destination is followed by exactly one end_put(), also when the connection broke half-way
// (complete = false): a backend may rely on it to know when nobody writes its memory.
//
// Thread-safety: implementations are called from every connection's thread at once.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "base/scratch_vector.h"
#include "base/status.h"
#include "cache/block_sink.h"
#include "cache/pool_key.h"

namespace peerserve {

class TieredBlockStore;

class BlockStreamBackend {
 public:
  virtual ~BlockStreamBackend() = default;

  // Reads `key` into the sink; false when absent.
  virtual Result<bool> get(const PoolKey& key, const BlockSink& sink) = 0;

  // Where the `size` bytes of block `key` are to be received; `scratch` is the connection's
  // own buffer, for backends that copy the block elsewhere afterwards (it grows without
  // zero-filling: memory not yet received into is never touched, so a client that declares
  // a large block and stalls pins no physical memory). An error refuses the block (the
  // server reads past it and reports the error to the client).
  virtual Result<std::span<std::byte>> begin_put(const PoolKey& key, size_t size,
                                                 ScratchVector<std::byte>& scratch) = 0;
  // The block's bytes are in the span begin_put() gave (all of them when `complete`). The
  // status is the client's answer for the block (ignored when not complete).
  virtual Status end_put(const PoolKey& key, std::span<const std::byte> bytes, bool complete) = 0;
};

// The cache server's backend: gets and puts go to the tiered store (a put is received into
// the connection's scratch buffer, then written through the tiers).
std::shared_ptr<BlockStreamBackend> tiered_block_stream_backend(
    std::shared_ptr<TieredBlockStore> store);

}  // namespace peerserve
