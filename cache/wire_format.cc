#include "cache/wire_format.h"

#include <grpc/impl/codegen/grpc_types.h>

namespace peerserve::cache_wire {
namespace wire = peerserve::cache::wire;

std::vector<std::pair<const char*, int>> bulk_transfer_channel_args() {
  return {
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20},
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1},
      {GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20},
      {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10},
      {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20},
  };
}

PoolKey from_wire(const wire::BlockKey& key) {
  return PoolKey{key.tenant(), key.hash()};
}

void to_wire(const PoolKey& key, wire::BlockKey* out) {
  out->set_tenant(key.tenant);
  out->set_hash(key.hash);
}

namespace {

void tier_to_wire(const TierStats& s, wire::TierStatsProto* out) {
  out->set_capacity_bytes(s.capacity_bytes);
  out->set_used_bytes(s.used_bytes);
  out->set_blocks(s.blocks);
  out->set_hits(s.hits);
  out->set_misses(s.misses);
  out->set_evictions(s.evictions);
  out->set_checksum_failures(s.checksum_failures);
  out->set_errors(s.errors);
  out->set_bytes_read(s.bytes_read);
  out->set_bytes_written(s.bytes_written);
  for (const auto& [tenant, bytes] : s.tenant_used_bytes) {
    (*out->mutable_tenant_used_bytes())[tenant] = bytes;
  }
}

TierStats tier_from_wire(const wire::TierStatsProto& p) {
  TierStats s;
  s.capacity_bytes = p.capacity_bytes();
  s.used_bytes = p.used_bytes();
  s.blocks = p.blocks();
  s.hits = p.hits();
  s.misses = p.misses();
  s.evictions = p.evictions();
  s.checksum_failures = p.checksum_failures();
  s.errors = p.errors();
  s.bytes_read = p.bytes_read();
  s.bytes_written = p.bytes_written();
  for (const auto& [tenant, bytes] : p.tenant_used_bytes()) s.tenant_used_bytes[tenant] = bytes;
  return s;
}

}  // namespace

void to_wire(const PoolStats& stats, wire::StatsReply* out) {
  tier_to_wire(stats.dram, out->mutable_dram());
  if (stats.ssd) tier_to_wire(*stats.ssd, out->mutable_ssd());
  out->set_gets(stats.gets);
  out->set_hits(stats.hits);
  out->set_misses(stats.misses);
  out->set_puts(stats.puts);
  out->set_put_errors(stats.put_errors);
}

PoolStats from_wire(const wire::StatsReply& reply) {
  PoolStats s;
  s.dram = tier_from_wire(reply.dram());
  if (reply.has_ssd()) s.ssd = tier_from_wire(reply.ssd());
  s.gets = reply.gets();
  s.hits = reply.hits();
  s.misses = reply.misses();
  s.puts = reply.puts();
  s.put_errors = reply.put_errors();
  return s;
}

void to_wire(uint32_t index, const Status& status, wire::BlockError* out) {
  out->set_index(index);
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(status.message());
}

Status from_wire(const wire::BlockError& error) {
  const int32_t code = error.code();
  if (code <= static_cast<int32_t>(StatusCode::kOk) ||
      code > static_cast<int32_t>(StatusCode::kInternal)) {
    return internal_error("cache server sent error code " + std::to_string(code) + ": " +
                          error.message());
  }
  return Status(static_cast<StatusCode>(code), error.message());
}

Status from_grpc(const grpc::Status& status, const std::string& member) {
  if (status.ok()) return ok_status();
  const std::string message = "cache server " + member + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED:
      return unavailable(message + " (" + std::to_string(status.error_code()) + ")");
    case grpc::StatusCode::INVALID_ARGUMENT:
      return invalid_argument(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return resource_exhausted(message);
    default:
      return internal_error(message + " (grpc code " + std::to_string(status.error_code()) + ")");
  }
}

grpc::Status to_grpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    default:
      break;
  }
  return grpc::Status(code, status.message());
}

}  // namespace peerserve::cache_wire
