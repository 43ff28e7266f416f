#include "cache/pool_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <vector>

#include "base/host_port.h"
#include "cache/pool.grpc.pb.h"
#include "cache/socket_io.h"
#include "cache/wire_format.h"

namespace peerserve {
namespace wire = peerserve::cache::wire;
using cache_wire::from_wire;
using cache_wire::kChunkBytes;
using cache_wire::to_grpc;
using cache_wire::to_wire;

#define PS_RETURN_GRPC_IF_ERROR(expr)                 \
  do {                                                \
    ::peerserve::Status ps_status_ = (expr);          \
    if (!ps_status_.ok()) return to_grpc(ps_status_); \
  } while (0)

class PoolServer::Service final : public wire::CachePool::Service {
 public:
  Service(std::shared_ptr<TieredBlockStore> store, const PoolServerOptions& options)
      : store_(std::move(store)), options_(options) {}

  uint64_t malformed() const { return malformed_.load(); }
  void set_block_stream(const BlockStreamServer* server) { block_stream_ = server; }

  grpc::Status Get(grpc::ServerContext* context, const wire::GetRequest* request,
                   grpc::ServerWriter<wire::GetChunk>* writer) override {
    PS_RETURN_GRPC_IF_ERROR(check_key_count(request->keys_size()));
    wire::GetChunk chunk;
    size_t chunk_bytes = 0;
    for (int i = 0; i < request->keys_size(); ++i) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      const uint32_t index = static_cast<uint32_t>(i);
      const PoolKey key = from_wire(request->keys(i));
      Status key_status = validate_pool_key(key);
      if (!key_status.ok()) {
        ++malformed_;
        to_wire(index, key_status, chunk.add_errors());
        continue;
      }
      std::string* data = nullptr;
      Result<bool> hit = store_->get(key, [&](size_t size) {
        // A stored block is never larger than a put may be; a larger size is a damaged
        // file's word, refused (empty destination) rather than allocated.
        if (size > options_.max_block_bytes) return std::span<std::byte>();
        data = chunk.add_found_data();
        data->resize(size);
        return std::span<std::byte>(reinterpret_cast<std::byte*>(data->data()), size);
      });
      if (hit.ok() && *hit) {
        chunk.add_found_index(index);
        chunk_bytes += data->size();
      } else {
        if (data != nullptr) chunk.mutable_found_data()->RemoveLast();  // rejected after the copy
        if (hit.ok()) {
          chunk.add_missing_index(index);
        } else {
          to_wire(index, hit.status(), chunk.add_errors());
        }
      }
      if (chunk_bytes >= kChunkBytes) {
        if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
        chunk.Clear();
        chunk_bytes = 0;
      }
    }
    if (chunk.ByteSizeLong() > 0 && !writer->Write(chunk)) return grpc::Status::CANCELLED;
    return grpc::Status::OK;
  }

  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<wire::PutChunk>* reader,
                   wire::PutReply* reply) override {
    wire::PutChunk chunk;
    uint64_t next_index = 0;
    while (reader->Read(&chunk)) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      if (chunk.keys_size() != chunk.data_size()) {
        ++malformed_;
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "PutChunk has " + std::to_string(chunk.keys_size()) + " keys and " +
                                std::to_string(chunk.data_size()) + " blocks, expected equal");
      }
      if (next_index + static_cast<uint64_t>(chunk.keys_size()) > options_.max_keys_per_request) {
        ++malformed_;
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "Put of more than " + std::to_string(options_.max_keys_per_request) +
                                " blocks in one call");
      }
      for (int i = 0; i < chunk.keys_size(); ++i, ++next_index) {
        const PoolKey key = from_wire(chunk.keys(i));
        const std::string& data = chunk.data(i);
        Status status = validate_pool_key(key);
        if (status.ok() && data.size() > options_.max_block_bytes) {
          status = invalid_argument("block " + to_string(key) + " is " +
                                    std::to_string(data.size()) + " bytes, more than the " +
                                    std::to_string(options_.max_block_bytes) + " a block may have");
        }
        if (!status.ok()) ++malformed_;
        if (status.ok()) {
          status =
              store_->put(key, std::span<const std::byte>(
                                   reinterpret_cast<const std::byte*>(data.data()), data.size()));
        }
        if (status.ok()) {
          reply->set_stored(reply->stored() + 1);
        } else {
          to_wire(static_cast<uint32_t>(next_index), status, reply->add_errors());
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Exists(grpc::ServerContext*, const wire::KeyList* request,
                      wire::ExistsReply* reply) override {
    PS_RETURN_GRPC_IF_ERROR(check_key_count(request->keys_size()));
    for (const wire::BlockKey& k : request->keys()) {
      const std::optional<uint64_t> size = store_->size_of(from_wire(k));
      reply->add_size(size ? static_cast<int64_t>(*size) : -1);
    }
    return grpc::Status::OK;
  }

  grpc::Status Remove(grpc::ServerContext*, const wire::KeyList* request,
                      wire::RemoveReply* reply) override {
    PS_RETURN_GRPC_IF_ERROR(check_key_count(request->keys_size()));
    for (const wire::BlockKey& k : request->keys()) {
      reply->add_removed(store_->remove(from_wire(k)));
    }
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext*, const wire::StatsRequest*,
                     wire::StatsReply* reply) override {
    to_wire(store_->stats(), reply);
    reply->set_malformed_requests(malformed_.load() +
                                  (block_stream_ ? block_stream_->malformed_requests() : 0));
    if (block_stream_) reply->set_block_stream_port(static_cast<uint32_t>(block_stream_->port()));
    return grpc::Status::OK;
  }

  grpc::Status Probe(grpc::ServerContext* context, const wire::ProbeRequest* request,
                     grpc::ServerWriter<wire::GetChunk>* writer) override {
    const uint64_t block = request->block_bytes();
    if (block == 0 || block > options_.max_block_bytes || request->total_bytes() > (64ull << 30)) {
      ++malformed_;
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "Probe: block_bytes " + std::to_string(block) + ", total_bytes " +
                              std::to_string(request->total_bytes()) +
                              ", expected 1..max block bytes and at most 64 GiB");
    }
    // The same message shape as a Get reply, filled from one buffer instead of the store, so
    // that Get's bandwidth divided by this one is the cost of the pool itself.
    const std::string payload(block, '\x5a');
    wire::GetChunk chunk;
    size_t chunk_bytes = 0;
    uint32_t index = 0;
    for (uint64_t sent = 0; sent < request->total_bytes(); sent += block, ++index) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      chunk.add_found_index(index);
      std::string* data = chunk.add_found_data();
      data->resize(block);
      std::copy(payload.begin(), payload.end(), data->begin());
      chunk_bytes += block;
      if (chunk_bytes >= kChunkBytes) {
        if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
        chunk.Clear();
        chunk_bytes = 0;
      }
    }
    if (chunk.ByteSizeLong() > 0 && !writer->Write(chunk)) return grpc::Status::CANCELLED;
    return grpc::Status::OK;
  }

 private:
  Status check_key_count(int count) {
    if (static_cast<uint64_t>(count) <= options_.max_keys_per_request) return ok_status();
    ++malformed_;
    return invalid_argument("request names " + std::to_string(count) + " keys, at most " +
                            std::to_string(options_.max_keys_per_request) + " allowed");
  }

  std::shared_ptr<TieredBlockStore> store_;
  PoolServerOptions options_;
  std::atomic<uint64_t> malformed_{0};
  const BlockStreamServer* block_stream_ = nullptr;
};

Result<std::unique_ptr<PoolServer>> PoolServer::start(std::shared_ptr<TieredBlockStore> store,
                                                      const PoolServerOptions& options) {
  PS_RETURN_IF_ERROR(check_host_port(options.listen, "cache server --listen", /*min_port=*/0));
  if (options.max_block_bytes < 1 || options.max_block_bytes > kLargestMaxBlockBytes) {
    return invalid_argument("cache server --max-block-bytes " +
                            std::to_string(options.max_block_bytes) + ": expected 1 .. " +
                            std::to_string(kLargestMaxBlockBytes) +
                            " (63M: a block returned over gRPC travels in one message of at "
                            "most 64 MiB)");
  }
  auto server = std::make_unique<PoolServer>(ConstructionKey{}, store);
  if (options.block_stream_port >= 0) {
    BlockStreamServerOptions stream;
    stream.host = endpoint_host(options.listen);
    stream.port = options.block_stream_port;
    stream.limits.max_keys = options.max_keys_per_request;
    stream.limits.max_block_bytes = options.max_block_bytes;
    PS_ASSIGN_OR_RETURN(server->block_stream_,
                        BlockStreamServer::start(tiered_block_stream_backend(store), stream));
  }
  server->service_ = std::make_unique<Service>(std::move(store), options);
  server->service_->set_block_stream(server->block_stream_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(cache_wire::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(cache_wire::kMaxMessageBytes);
  for (const auto& [name, value] : cache_wire::bulk_transfer_channel_args()) {
    builder.AddChannelArgument(name, value);
  }
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return unavailable("cache server: cannot listen on " + options.listen +
                       " (address in use or not local?)");
  }
  return server;
}

PoolServer::PoolServer(ConstructionKey, std::shared_ptr<TieredBlockStore> store)
    : store_(std::move(store)) {}

PoolServer::~PoolServer() {
  if (server_ != nullptr) shutdown(std::chrono::milliseconds(0));
}

void PoolServer::shutdown(std::chrono::milliseconds grace) {
  if (block_stream_) block_stream_->stop();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
}

void PoolServer::wait() {
  server_->Wait();
}

uint64_t PoolServer::malformed_requests() const {
  return service_->malformed() + (block_stream_ ? block_stream_->malformed_requests() : 0);
}

}  // namespace peerserve
