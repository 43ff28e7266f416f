// PoolKey: how the caching pool names a stored block.
//
// A block is stored under (tenant, hash). The tenant is the pool namespace: one tenant can
// never read, overwrite, remove or evict another's blocks, and may have its own capacity.
// The hash is a KV block's hash-chain value rooted in its KvNamespace (kv/kv_namespace.h),
// which already separates models and layouts, or any other 64-bit content id (model
// caching stores weight shards under their own ids).
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "kv/prefix_hash.h"

namespace peerserve {

struct PoolKey {
  std::string tenant;
  BlockHash hash = 0;

  friend bool operator==(const PoolKey&, const PoolKey&) = default;
};

// "tenant/0123456789abcdef" (for messages and logs).
std::string to_string(const PoolKey& key);
// The 16 lower-case hex digits of a hash (a file name in the SSD tier).
std::string hash_hex(BlockHash hash);

// Errors name the key when the tenant is not a valid namespace name.
Status validate_pool_key(const PoolKey& key);

struct PoolKeyHasher {
  size_t operator()(const PoolKey& key) const {
    return std::hash<std::string>()(key.tenant) ^ (key.hash * 0x9e3779b97f4a7c15ULL);
  }
};

}  // namespace peerserve
