#include "cache/block_stream_protocol.h"

#include <algorithm>
#include <cstring>

namespace peerserve::block_stream {

void append_u8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}

void append_u16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void append_u32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void append_u64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void append_status(std::string* out, const Status& status) {
  append_u32(out, static_cast<uint32_t>(static_cast<int32_t>(status.code())));
  const size_t n = std::min<size_t>(status.message().size(), 0xffff);
  append_u16(out, static_cast<uint16_t>(n));
  out->append(status.message(), 0, n);
}

uint64_t read_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint32_t read_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint16_t read_u16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}

std::string encode_request(uint8_t op, std::span<const PoolKey> keys,
                           std::span<const uint64_t> sizes) {
  std::string table;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t n = std::min<size_t>(keys[i].tenant.size(), 255);
    append_u8(&table, static_cast<uint8_t>(n));
    table.append(keys[i].tenant, 0, n);
    append_u64(&table, keys[i].hash);
    if (op == kOpPut) append_u64(&table, i < sizes.size() ? sizes[i] : 0);
  }
  std::string out;
  out.reserve(kHeaderBytes + table.size());
  append_u32(&out, kMagic);
  append_u8(&out, op);
  out.append(3, '\0');
  append_u32(&out, static_cast<uint32_t>(keys.size()));
  append_u32(&out, static_cast<uint32_t>(table.size()));
  out += table;
  return out;
}

Result<RequestHeader> parse_header(std::span<const std::byte> bytes, const RequestLimits& limits) {
  if (bytes.size() < kHeaderBytes) {
    return invalid_argument("block-stream header of " + std::to_string(bytes.size()) +
                            " bytes, expected " + std::to_string(kHeaderBytes));
  }
  if (read_u32(bytes.data()) != kMagic) {
    return invalid_argument(
        "block-stream request without the PSB1 magic (not a peerserve client?)");
  }
  RequestHeader h;
  h.op = static_cast<uint8_t>(bytes[4]);
  h.count = read_u32(bytes.data() + 8);
  h.table_bytes = read_u32(bytes.data() + 12);
  if (h.op != kOpGet && h.op != kOpPut) {
    return invalid_argument("block-stream op " + std::to_string(h.op) + ", expected 1 or 2");
  }
  if (h.count > limits.max_keys) {
    return invalid_argument("block-stream request names " + std::to_string(h.count) +
                            " keys, at most " + std::to_string(limits.max_keys) + " allowed");
  }
  if (static_cast<uint64_t>(h.table_bytes) > static_cast<uint64_t>(h.count) * kMaxEntryBytes) {
    return invalid_argument("block-stream table of " + std::to_string(h.table_bytes) +
                            " bytes is larger than " + std::to_string(h.count) + " entries can be");
  }
  return h;
}

Result<std::vector<TableEntry>> parse_table(const RequestHeader& header,
                                            std::span<const std::byte> table) {
  if (table.size() != header.table_bytes) {
    return invalid_argument("block-stream table of " + std::to_string(table.size()) +
                            " bytes, the header says " + std::to_string(header.table_bytes));
  }
  std::vector<TableEntry> entries;
  entries.reserve(header.count);
  size_t at = 0;
  const size_t fixed = header.op == kOpPut ? 16 : 8;
  for (uint32_t i = 0; i < header.count; ++i) {
    if (at >= table.size())
      return invalid_argument("block-stream table ends at entry " + std::to_string(i));
    const size_t n = static_cast<uint8_t>(table[at]);
    if (table.size() - at - 1 < n + fixed) {
      return invalid_argument("block-stream table entry " + std::to_string(i) + " is cut off");
    }
    TableEntry e;
    e.key.tenant.assign(reinterpret_cast<const char*>(table.data() + at + 1), n);
    e.key.hash = read_u64(table.data() + at + 1 + n);
    if (header.op == kOpPut) e.size = read_u64(table.data() + at + 1 + n + 8);
    at += 1 + n + fixed;
    entries.push_back(std::move(e));
  }
  if (at != table.size()) {
    return invalid_argument("block-stream table has " + std::to_string(table.size() - at) +
                            " bytes after its last entry");
  }
  return entries;
}

}  // namespace peerserve::block_stream
