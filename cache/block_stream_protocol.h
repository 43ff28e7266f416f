// The block-stream protocol: the caching pool's bulk data path for Get and Put, a plain
// binary framing over one TCP connection per call in flight. gRPC stays the control path
// (Exists, Remove, Stats, and advertising this port); blocks move here because gRPC's
// per-block protobuf copies cap batched gets at about 0.2 of raw TCP on loopback
// (bench/cache/pool_bench.cc), and because a client can receive a block straight into the
// caller's buffer (no staging copy).
//
// Little-endian throughout. A request:
//   header   magic u32 ("PSB1"), op u8 (1 get, 2 put), reserved u8[3], count u32,
//            table_bytes u32
//   table    count entries: tenant_len u8, tenant bytes, hash u64, and for put size u64
//   payload  put only: the blocks, in table order, back to back
// A get reply, per key in request order: kind u8 (0 hit, 1 miss, 2 error), then for a hit
// size u64 and the block's bytes, for an error code i32, message_len u16, message.
// A put reply, per key in order: code i32 (0 = stored), message_len u16, message.
// A connection carries any number of requests one after the other.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cache/pool_key.h"

namespace peerserve::block_stream {

constexpr uint32_t kMagic = 0x31425350;  // "PSB1"
constexpr size_t kHeaderBytes = 16;
constexpr uint8_t kOpGet = 1;
constexpr uint8_t kOpPut = 2;
constexpr uint8_t kHit = 0;
constexpr uint8_t kMiss = 1;
constexpr uint8_t kError = 2;
// Bytes of one table entry at most (tenant of 255 bytes).
constexpr size_t kMaxEntryBytes = 1 + 255 + 8 + 8;

struct RequestHeader {
  uint8_t op = 0;
  uint32_t count = 0;
  uint32_t table_bytes = 0;
};

struct TableEntry {
  PoolKey key;
  uint64_t size = 0;  // put only
};

// Limits a server enforces on what a client sends.
struct RequestLimits {
  uint32_t max_keys = 1 << 16;
  uint64_t max_block_bytes = 32ull << 20;
};

// The encoded header and table of a request (put: `sizes` parallel to `keys`).
std::string encode_request(uint8_t op, std::span<const PoolKey> keys,
                           std::span<const uint64_t> sizes = {});

// InvalidArgument naming what is wrong: bad magic, unknown op, more keys than allowed, a
// table larger than `count` entries can be.
Result<RequestHeader> parse_header(std::span<const std::byte> bytes, const RequestLimits& limits);
// Parses exactly header.count entries filling exactly the table's bytes. Tenants and block
// sizes are not judged here: they are per-block errors (the server reads past a block it
// refuses, so the stream stays in step).
Result<std::vector<TableEntry>> parse_table(const RequestHeader& header,
                                            std::span<const std::byte> table);

// Little-endian helpers for replies.
void append_u8(std::string* out, uint8_t v);
void append_u16(std::string* out, uint16_t v);
void append_u32(std::string* out, uint32_t v);
void append_u64(std::string* out, uint64_t v);
// code + message (truncated to 65,535 bytes).
void append_status(std::string* out, const Status& status);
uint64_t read_u64(const std::byte* p);
uint32_t read_u32(const std::byte* p);
uint16_t read_u16(const std::byte* p);

}  // namespace peerserve::block_stream
