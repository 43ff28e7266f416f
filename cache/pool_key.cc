#include "cache/pool_key.h"

#include <cstdio>

#include "kv/kv_namespace.h"

namespace peerserve {

std::string hash_hex(BlockHash hash) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

std::string to_string(const PoolKey& key) {
  return key.tenant + "/" + hash_hex(key.hash);
}

Status validate_pool_key(const PoolKey& key) {
  return validate_tenant_name(key.tenant);
}

}  // namespace peerserve
