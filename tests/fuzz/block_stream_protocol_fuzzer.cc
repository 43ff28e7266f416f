// libFuzzer target: arbitrary bytes as a block-stream request (what a cache server reads from
// any client): the header, then the table. Traps when an accepted table does not re-encode
// to the same bytes (the parser must read exactly what the encoder writes).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/block_stream_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace bs = peerserve::block_stream;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  bs::RequestLimits limits;
  limits.max_keys = 4096;
  auto header = bs::parse_header(bytes, limits);
  if (!header.ok()) return 0;
  const std::span<const std::byte> rest = bytes.subspan(bs::kHeaderBytes);
  if (rest.size() < header->table_bytes) return 0;
  auto entries = bs::parse_table(*header, rest.first(header->table_bytes));
  if (!entries.ok()) return 0;
  std::vector<peerserve::PoolKey> keys;
  std::vector<uint64_t> sizes;
  for (const bs::TableEntry& e : *entries) {
    keys.push_back(e.key);
    sizes.push_back(e.size);
  }
  const std::string again = bs::encode_request(header->op, keys, sizes);
  if (again.size() != bs::kHeaderBytes + header->table_bytes) __builtin_trap();
  for (size_t i = bs::kHeaderBytes; i < again.size(); ++i) {
    if (static_cast<std::byte>(again[i]) != bytes[i]) __builtin_trap();
  }
  return 0;
}
