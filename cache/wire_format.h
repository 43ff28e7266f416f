// Conversions between the cache server's protobuf messages (cache/pool.proto) and peerserve
// types, shared by the server and the gRPC transport. Internal to cache/.
#pragma once

#include <grpcpp/support/status.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "base/status.h"
#include "cache/pool.pb.h"
#include "cache/pool_key.h"
#include "cache/tiered_block_store.h"

namespace peerserve::cache_wire {

// Target payload of one chunk of a streamed Get or Put: large enough that per-message costs
// vanish, small enough to pipeline.
inline constexpr size_t kChunkBytes = 1 << 20;
// Largest message either side accepts.
inline constexpr int kMaxMessageBytes = 64 << 20;

// HTTP/2 and TCP settings both sides use for bulk blocks: (name, value) pairs for
// grpc::ChannelArguments / ServerBuilder::AddChannelArgument. The defaults (64 KiB stream
// window, 16 KiB frames, 8 KiB reads) cost a window update round trip every 64 KiB.
std::vector<std::pair<const char*, int>> bulk_transfer_channel_args();

PoolKey from_wire(const peerserve::cache::wire::BlockKey& key);
void to_wire(const PoolKey& key, peerserve::cache::wire::BlockKey* out);

void to_wire(const PoolStats& stats, peerserve::cache::wire::StatsReply* out);
PoolStats from_wire(const peerserve::cache::wire::StatsReply& reply);

void to_wire(uint32_t index, const Status& status, peerserve::cache::wire::BlockError* out);
// A BlockError as a Status; unknown codes become kInternal.
Status from_wire(const peerserve::cache::wire::BlockError& error);

// A gRPC status as a peerserve Status, naming the member. Unreachable members, deadlines and
// cancellations map to kUnavailable.
Status from_grpc(const grpc::Status& status, const std::string& member);
grpc::Status to_grpc(const Status& status);

}  // namespace peerserve::cache_wire
