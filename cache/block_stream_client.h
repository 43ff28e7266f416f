// BlockStreamClient: Get and Put over a member's block-stream port
// (cache/block_stream_protocol.h), with the PoolTransport contract: every call ends by its
// deadline; per-block outcomes; a call cut off half-way reports the blocks it completed and
// errors for the rest. A get receives each block straight into its sink (no staging copy),
// so the sink of a block that is not reported a hit may hold part of it.
//
// Connections are kept for reuse (one per call in flight); one that saw any error is closed.
// A call whose kept connection turns out closed by the member (its idle timeout) before any
// reply arrived is sent again once on a new connection.
//
// Thread-safety: safe from several threads.
#pragma once

#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/pool_transport.h"
#include "cache/socket_io.h"

namespace peerserve {

class BlockStreamClient {
 public:
  // `host` and `port` of the member's block-stream listener; `name` for messages.
  BlockStreamClient(std::string host, int port, std::string name);

  std::vector<BlockLookup> get(std::span<const PoolKey> keys, std::span<const BlockSink> sinks,
                               PoolDeadline deadline);
  std::vector<Status> put(std::span<const PoolKey> keys,
                          std::span<const std::span<const std::byte>> blocks,
                          PoolDeadline deadline);

 private:
  std::vector<BlockLookup> get_once(std::span<const PoolKey> keys, std::span<const BlockSink> sinks,
                                    PoolDeadline deadline, bool fresh, bool* retry);
  std::vector<Status> put_once(std::span<const PoolKey> keys,
                               std::span<const std::span<const std::byte>> blocks,
                               PoolDeadline deadline, bool fresh, bool* retry);
  // A kept connection (reused = true) or a new one.
  Result<SocketFd> take(PoolDeadline deadline, bool fresh, bool* reused);
  void give_back(SocketFd fd);

  const std::string host_, port_, name_;
  std::mutex mutex_;
  std::vector<SocketFd> idle_;
};

}  // namespace peerserve
