// GrpcPoolTransport: a pool member reached over gRPC (a `peerserve cache-server`). Get and
// Put go over the member's block-stream data path when it has one
// (cache/block_stream_client.h), else stream blocks over gRPC in ~1 MiB chunks; every call
// carries its deadline.
//
// Connecting is bounded separately by `connect_timeout`: a member whose port refuses or
// does not answer fails fast with kUnavailable rather than using up the call's whole
// deadline. The channel reconnects by itself (100 ms to 1 s backoff) once the member is
// back, e.g. after a restart on the same SSD folder.
//
// Thread-safety: safe from several threads (one channel, one stub, per-call contexts).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "cache/pool_transport.h"

namespace peerserve {

struct GrpcPoolTransportOptions {
  std::chrono::milliseconds connect_timeout{500};
  // Move Get/Put blocks over the member's block-stream port when it advertises one (learnt
  // from its Stats reply at the first get or put); false: everything over gRPC.
  bool use_block_stream = true;
};

// `address` is "host:port". Creating the transport does not connect yet.
std::unique_ptr<PoolTransport> make_grpc_pool_transport(const std::string& address,
                                                        const GrpcPoolTransportOptions& options);

// The transport's own streaming bandwidth, for benchmarks (the ceiling of Get over this
// transport): asks the member for `total_bytes` in blocks of `block_bytes`, shaped like a
// Get reply but produced without the store, and copies each block out once as Get does.
// One channel per probe object, as a transport has.
class GrpcTransportProbe {
 public:
  explicit GrpcTransportProbe(const std::string& address);
  ~GrpcTransportProbe();
  // Returns the bytes received.
  Result<uint64_t> run(uint64_t total_bytes, uint32_t block_bytes,
                       std::chrono::milliseconds timeout);

 private:
  struct Channel;
  std::string address_;
  std::unique_ptr<Channel> channel_;
};

}  // namespace peerserve
