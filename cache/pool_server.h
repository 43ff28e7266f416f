// PoolServer: one member of the caching pool (the paper's MP server) serving a
// TieredBlockStore over gRPC (cache/pool.proto), with Get/Put blocks also over the
// block-stream data path (cache/block_stream_server.h) that gRPC advertises.
//
// Every request is checked before it touches the store: a bad tenant, a block larger than
// max_block_bytes, more keys than max_keys_per_request, or a Put chunk whose keys and
// blocks do not pair up is an error reply (INVALID_ARGUMENT, per block where it can be),
// never a crash; bytes that are not a valid message are rejected by gRPC before any
// handler runs. Handlers stop early when their client cancels or its deadline passes.
//
// Thread-safety: start() and shutdown() from one thread; requests are served on gRPC's
// threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "cache/block_stream_server.h"
#include "cache/tiered_block_store.h"

namespace grpc {
class Server;
}

namespace peerserve {

// The largest max_block_bytes a server takes: a Get over gRPC returns a block in one message
// of at most 64 MiB (cache_wire::kMaxMessageBytes), beside its keys.
inline constexpr uint64_t kLargestMaxBlockBytes = 63ull << 20;

struct PoolServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  uint32_t max_keys_per_request = 1 << 16;
  uint64_t max_block_bytes = 32ull << 20;  // 1 .. kLargestMaxBlockBytes
  // The block-stream data path (cache/block_stream_server.h) on the listen host: -1 off,
  // 0 any free port, else that port. Advertised to clients in StatsReply.
  int block_stream_port = 0;
};

class PoolServer {
  struct ConstructionKey {};

 public:
  // Errors: a listen address that cannot be bound (names it).
  static Result<std::unique_ptr<PoolServer>> start(std::shared_ptr<TieredBlockStore> store,
                                                   const PoolServerOptions& options);
  PoolServer(ConstructionKey, std::shared_ptr<TieredBlockStore> store);
  ~PoolServer();

  // The port actually bound (the chosen one when options.listen asked for port 0).
  int port() const { return port_; }
  // The block-stream port, 0 when off.
  int block_stream_port() const { return block_stream_ ? block_stream_->port() : 0; }
  // Stops accepting calls and waits up to `grace` for running ones, then cancels them.
  void shutdown(std::chrono::milliseconds grace);
  // Blocks until shutdown() (from another thread or a signal handler thread).
  void wait();
  // Requests rejected by validation so far.
  uint64_t malformed_requests() const;

 private:
  class Service;

  std::shared_ptr<TieredBlockStore> store_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<BlockStreamServer> block_stream_;
  int port_ = 0;
};

}  // namespace peerserve
