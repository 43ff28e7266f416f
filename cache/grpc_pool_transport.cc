#include "cache/grpc_pool_transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "cache/block_stream_client.h"
#include "cache/pool.grpc.pb.h"
#include "cache/socket_io.h"
#include "cache/wire_format.h"

namespace peerserve {
namespace {
namespace wire = peerserve::cache::wire;
using cache_wire::from_grpc;
using cache_wire::from_wire;
using cache_wire::to_wire;

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(cache_wire::kMaxMessageBytes);
  args.SetMaxSendMessageSize(cache_wire::kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A fresh channel per transport: members never share one TCP connection's head-of-line.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [name, value] : cache_wire::bulk_transfer_channel_args())
    args.SetInt(name, value);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::chrono::system_clock::time_point to_system(PoolDeadline deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline -
                                                                         PoolClock::now());
}

class GrpcPoolTransport final : public PoolTransport {
 public:
  GrpcPoolTransport(std::string address, const GrpcPoolTransportOptions& options)
      : address_(std::move(address)),
        options_(options),
        channel_(make_channel(address_)),
        stub_(wire::CachePool::NewStub(channel_)) {}

  const std::string& name() const override { return address_; }

  std::vector<BlockLookup> get(std::span<const PoolKey> keys, std::span<const BlockSink> sinks,
                               PoolDeadline deadline) override {
    PS_CHECK_EQ(keys.size(), sinks.size());
    if (!keys.empty()) {
      Result<std::shared_ptr<BlockStreamClient>> stream = block_stream(deadline);
      if (!stream.ok()) {
        return std::vector<BlockLookup>(keys.size(), BlockLookup::failed(stream.status()));
      }
      if (*stream != nullptr) {
        std::vector<BlockLookup> out = (*stream)->get(keys, sinks, deadline);
        if (std::any_of(out.begin(), out.end(), [](const BlockLookup& r) {
              return r.kind == BlockLookup::Kind::kError &&
                     r.error.code() == StatusCode::kUnavailable;
            })) {
          forget_block_stream();
        }
        return out;
      }
    }
    std::vector<BlockLookup> out(keys.size());
    std::vector<bool> answered(keys.size(), false);
    auto fail_unanswered = [&](const Status& status) {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!answered[i]) out[i] = BlockLookup::failed(status);
      }
      return out;
    };
    if (keys.empty()) return out;
    if (Status connected = ensure_connected(deadline); !connected.ok()) {
      return fail_unanswered(connected);
    }
    wire::GetRequest request;
    for (const PoolKey& key : keys) to_wire(key, request.add_keys());
    grpc::ClientContext context;
    context.set_deadline(to_system(deadline));
    std::unique_ptr<grpc::ClientReader<wire::GetChunk>> reader = stub_->Get(&context, request);
    wire::GetChunk chunk;
    Status protocol = ok_status();
    auto claim = [&](uint32_t index) {
      if (index >= keys.size() || answered[index]) {
        protocol = internal_error("cache server " + address_ + " answered block " +
                                  std::to_string(index) + " twice or out of range");
        return false;
      }
      answered[index] = true;
      return true;
    };
    while (protocol.ok() && reader->Read(&chunk)) {
      if (chunk.found_index_size() != chunk.found_data_size()) {
        protocol = internal_error("cache server " + address_ + " sent a malformed Get reply");
        break;
      }
      for (int i = 0; i < chunk.found_index_size() && protocol.ok(); ++i) {
        const uint32_t index = chunk.found_index(i);
        if (!claim(index)) break;
        const std::string& data = chunk.found_data(i);
        const std::span<std::byte> dst = sinks[index](data.size());
        if (dst.size() != data.size()) {
          out[index] = BlockLookup::failed(invalid_argument(
              "cache block " + to_string(keys[index]) + " is " + std::to_string(data.size()) +
              " bytes, the destination " + std::to_string(dst.size())));
          continue;
        }
        std::memcpy(dst.data(), data.data(), data.size());
        out[index] = BlockLookup::hit_result();
      }
      for (uint32_t index : chunk.missing_index()) {
        if (!claim(index)) break;
        out[index] = BlockLookup::miss();
      }
      for (const wire::BlockError& error : chunk.errors()) {
        if (!claim(error.index())) break;
        out[error.index()] = BlockLookup::failed(from_wire(error));
      }
    }
    if (!protocol.ok()) {
      context.TryCancel();
      (void)reader->Finish();
      return fail_unanswered(protocol);
    }
    const Status finished = from_grpc(reader->Finish(), address_);
    if (!finished.ok()) return fail_unanswered(finished);
    return fail_unanswered(
        internal_error("cache server " + address_ + " left blocks of a Get unanswered"));
  }

  std::vector<Status> put(std::span<const PoolKey> keys,
                          std::span<const std::span<const std::byte>> blocks,
                          PoolDeadline deadline) override {
    PS_CHECK_EQ(keys.size(), blocks.size());
    std::vector<Status> out(keys.size());
    if (keys.empty()) return out;
    {
      Result<std::shared_ptr<BlockStreamClient>> stream = block_stream(deadline);
      if (!stream.ok()) return std::vector<Status>(keys.size(), stream.status());
      if (*stream != nullptr) {
        std::vector<Status> out = (*stream)->put(keys, blocks, deadline);
        if (std::any_of(out.begin(), out.end(),
                        [](const Status& st) { return st.code() == StatusCode::kUnavailable; })) {
          forget_block_stream();
        }
        return out;
      }
    }
    auto fail_all = [&](const Status& status) {
      std::fill(out.begin(), out.end(), status);
      return out;
    };
    if (Status connected = ensure_connected(deadline); !connected.ok()) return fail_all(connected);
    grpc::ClientContext context;
    context.set_deadline(to_system(deadline));
    wire::PutReply reply;
    std::unique_ptr<grpc::ClientWriter<wire::PutChunk>> writer = stub_->Put(&context, &reply);
    wire::PutChunk chunk;
    size_t chunk_bytes = 0;
    bool stream_ok = true;
    for (size_t i = 0; i < keys.size() && stream_ok; ++i) {
      to_wire(keys[i], chunk.add_keys());
      chunk.add_data(reinterpret_cast<const char*>(blocks[i].data()), blocks[i].size());
      chunk_bytes += blocks[i].size();
      if (chunk_bytes >= cache_wire::kChunkBytes || i + 1 == keys.size()) {
        stream_ok = writer->Write(chunk);
        chunk.Clear();
        chunk_bytes = 0;
      }
    }
    if (stream_ok) writer->WritesDone();
    const Status finished = from_grpc(writer->Finish(), address_);
    if (!finished.ok()) return fail_all(finished);
    for (const wire::BlockError& error : reply.errors()) {
      if (error.index() < keys.size()) out[error.index()] = from_wire(error);
    }
    return out;
  }

  Result<std::vector<std::optional<uint64_t>>> exists(std::span<const PoolKey> keys,
                                                      PoolDeadline deadline) override {
    PS_RETURN_IF_ERROR(ensure_connected(deadline));
    wire::KeyList request;
    for (const PoolKey& key : keys) to_wire(key, request.add_keys());
    grpc::ClientContext context;
    context.set_deadline(to_system(deadline));
    wire::ExistsReply reply;
    PS_RETURN_IF_ERROR(from_grpc(stub_->Exists(&context, request, &reply), address_));
    if (static_cast<size_t>(reply.size_size()) != keys.size()) {
      return internal_error("cache server " + address_ + " answered Exists for " +
                            std::to_string(reply.size_size()) + " of " +
                            std::to_string(keys.size()) + " keys");
    }
    std::vector<std::optional<uint64_t>> out;
    for (int64_t size : reply.size()) {
      out.push_back(size < 0 ? std::nullopt : std::optional<uint64_t>(size));
    }
    return out;
  }

  Result<std::vector<bool>> remove(std::span<const PoolKey> keys, PoolDeadline deadline) override {
    PS_RETURN_IF_ERROR(ensure_connected(deadline));
    wire::KeyList request;
    for (const PoolKey& key : keys) to_wire(key, request.add_keys());
    grpc::ClientContext context;
    context.set_deadline(to_system(deadline));
    wire::RemoveReply reply;
    PS_RETURN_IF_ERROR(from_grpc(stub_->Remove(&context, request, &reply), address_));
    if (static_cast<size_t>(reply.removed_size()) != keys.size()) {
      return internal_error("cache server " + address_ + " answered Remove for " +
                            std::to_string(reply.removed_size()) + " of " +
                            std::to_string(keys.size()) + " keys");
    }
    return std::vector<bool>(reply.removed().begin(), reply.removed().end());
  }

  Result<PoolStats> stats(PoolDeadline deadline) override { return stats_reply(deadline, nullptr); }

 private:
  // The member's block-stream client, or null to use gRPC. Asks the member (Stats) at the
  // first call and again after the data path failed (a restarted member may listen on
  // another block-stream port).
  Result<std::shared_ptr<BlockStreamClient>> block_stream(PoolDeadline deadline) {
    if (!options_.use_block_stream) return std::shared_ptr<BlockStreamClient>();
    std::lock_guard<std::mutex> lock(stream_mutex_);
    if (stream_probed_) return stream_;
    uint32_t port = 0;
    PS_ASSIGN_OR_RETURN(PoolStats ignored, stats_reply(deadline, &port));
    (void)ignored;
    stream_probed_ = true;
    stream_.reset();
    if (port > 0) {
      stream_ = std::make_shared<BlockStreamClient>(endpoint_host(address_), static_cast<int>(port),
                                                    address_);
    }
    return stream_;
  }

  void forget_block_stream() {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    stream_probed_ = false;
  }

  Result<PoolStats> stats_reply(PoolDeadline deadline, uint32_t* block_stream_port) {
    PS_RETURN_IF_ERROR(ensure_connected(deadline));
    grpc::ClientContext context;
    context.set_deadline(to_system(deadline));
    wire::StatsReply reply;
    PS_RETURN_IF_ERROR(from_grpc(stub_->Stats(&context, wire::StatsRequest(), &reply), address_));
    if (block_stream_port != nullptr) *block_stream_port = reply.block_stream_port();
    return from_wire(reply);
  }

  // Waits for a connection at most connect_timeout (and never past the call's deadline).
  Status ensure_connected(PoolDeadline deadline) {
    if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return ok_status();
    const PoolDeadline connect_by = std::min(deadline, PoolClock::now() + options_.connect_timeout);
    const auto waited_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(connect_by - PoolClock::now());
    if (channel_->WaitForConnected(to_system(connect_by))) return ok_status();
    return unavailable("cache server " + address_ + ": not reachable within " +
                       std::to_string(std::max<int64_t>(0, waited_ms.count())) + " ms");
  }

  std::string address_;
  GrpcPoolTransportOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<wire::CachePool::Stub> stub_;
  std::mutex stream_mutex_;
  bool stream_probed_ = false;
  std::shared_ptr<BlockStreamClient> stream_;
};

}  // namespace

std::unique_ptr<PoolTransport> make_grpc_pool_transport(const std::string& address,
                                                        const GrpcPoolTransportOptions& options) {
  return std::make_unique<GrpcPoolTransport>(address, options);
}

struct GrpcTransportProbe::Channel {
  std::unique_ptr<wire::CachePool::Stub> stub;
};

GrpcTransportProbe::GrpcTransportProbe(const std::string& address)
    : address_(address),
      channel_(
          std::make_unique<Channel>(Channel{wire::CachePool::NewStub(make_channel(address))})) {}

GrpcTransportProbe::~GrpcTransportProbe() = default;

Result<uint64_t> GrpcTransportProbe::run(uint64_t total_bytes, uint32_t block_bytes,
                                         std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  wire::ProbeRequest request;
  request.set_total_bytes(total_bytes);
  request.set_block_bytes(block_bytes);
  std::unique_ptr<grpc::ClientReader<wire::GetChunk>> reader =
      channel_->stub->Probe(&context, request);
  wire::GetChunk chunk;
  uint64_t received = 0;
  std::vector<char> sink(block_bytes);
  volatile char observed = 0;  // keeps the copies from being optimised away
  while (reader->Read(&chunk)) {
    for (const std::string& data : chunk.found_data()) {
      std::memcpy(sink.data(), data.data(), std::min<size_t>(data.size(), sink.size()));
      observed = sink[0];
      received += data.size();
    }
  }
  (void)observed;
  PS_RETURN_IF_ERROR(from_grpc(reader->Finish(), address_));
  return received;
}

}  // namespace peerserve
