// BlockStreamServer: the cache server's bulk data path (and a decode instance's KV hand-off
// receiver, with another backend: cache/block_stream_backend.h) (cache/block_stream_protocol.h):
// Get and Put of blocks over plain TCP, beside the gRPC service that stays the control path and
// advertises this port (StatsReply.block_stream_port).
//
// A thread per connection (clients keep one connection per call in flight, so a handful per
// engine) up to `max_connections`. At the cap a new connection takes the place of the one
// idle longest (it is shut down; its client reconnects when it has work), and is closed at
// once only when every connection is inside a request: silent connections cannot shut out
// clients with work. Buffers grown for a request larger than 1 MiB are given back after it,
// so memory between requests does not grow with the connections. Everything a client sends is
// checked before it touches the store (protocol limits, tenants, block sizes); a malformed
// request closes its connection and is counted, never a crash. A connection idle longer
// than `idle_timeout` between requests is closed, and so is one whose request (reading it,
// its blocks, and writing the reply) takes longer than `io_timeout` as a whole: a client
// slower than its blocks' bytes per io_timeout is cut off even while it sends.
//
// Thread-safety: stop() and the accessors from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/scratch_vector.h"
#include "base/status.h"
#include "cache/block_stream_backend.h"
#include "cache/block_stream_protocol.h"

namespace peerserve {

struct BlockStreamServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  block_stream::RequestLimits limits;
  int max_connections = 256;
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds io_timeout{30000};
};

class BlockStreamServer {
 public:
  // Errors: a host/port that cannot be bound (names it).
  static Result<std::unique_ptr<BlockStreamServer>> start(
      std::shared_ptr<BlockStreamBackend> backend, const BlockStreamServerOptions& options);
  ~BlockStreamServer();

  int port() const { return port_; }
  // Stops accepting, closes every connection and joins their threads.
  void stop();
  uint64_t malformed_requests() const { return malformed_.load(); }
  // Idle connections shut down at the cap to make room for new ones.
  uint64_t evicted_connections() const { return evicted_.load(); }

 private:
  struct Connection {
    static constexpr int64_t kBusy = -1;
    int fd = -1;  // open while >= 0; its thread closes it and sets -1 under mutex_
    std::thread thread;
    std::atomic<bool> done{false};
    // Since when (steady clock, ns) it has waited for a request; kBusy inside one.
    std::atomic<int64_t> idle_since{0};
    bool evicted = false;  // shut down to make room (under mutex_)
  };
  BlockStreamServer(std::shared_ptr<BlockStreamBackend> backend,
                    const BlockStreamServerOptions& options)
      : backend_(std::move(backend)), options_(options) {}
  void accept_loop();
  // At the cap: shuts down the connection idle longest; false if every one is busy.
  bool evict_idlest_locked();
  void serve(Connection& connection);
  // One request; false when the connection must close.
  // `table` and `scratch` grow without zero-filling (base/scratch_vector.h): what a client
  // declares but does not send is never touched, so a stalled client pins no memory.
  bool serve_request(Connection& connection, ScratchVector<std::byte>& table, std::string& reply,
                     std::string& block, ScratchVector<std::byte>& scratch);

  std::shared_ptr<BlockStreamBackend> backend_;
  const BlockStreamServerOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> evicted_{0};
  std::mutex mutex_;
  std::list<Connection> connections_;
  std::thread acceptor_;
};

}  // namespace peerserve
