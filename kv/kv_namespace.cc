#include "kv/kv_namespace.h"

#include <cstdio>

namespace peerserve {

Status validate_tenant_name(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return invalid_argument("KV namespace '" + std::string(name.substr(0, 80)) + "': length " +
                            std::to_string(name.size()) + ", expected 1 to 64 characters");
  }
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!allowed) {
      return invalid_argument("KV namespace '" + std::string(name) +
                              "': character not in [A-Za-z0-9._-]");
    }
  }
  if (name == "." || name == "..") {
    return invalid_argument("KV namespace '" + std::string(name) + "' is reserved");
  }
  return ok_status();
}

Status KvNamespace::validate() const {
  PS_RETURN_IF_ERROR(validate_tenant_name(tenant));
  if (model_id.empty()) return invalid_argument("KV namespace: model_id is empty");
  PS_RETURN_IF_ERROR(layout.validate());
  if (layout_version == 0) return invalid_argument("KV namespace: layout_version = 0");
  return ok_status();
}

std::string KvNamespace::canonical_identity() const {
  // Length-prefixed strings so that no two field combinations print the same.
  auto field = [](std::string_view key, std::string_view value) {
    return std::string(key) + "=" + std::to_string(value.size()) + ":" + std::string(value) + ";";
  };
  std::string s = "peerserve-kv/1;";
  s += field("tenant", tenant);
  s += field("model", model_id);
  s += field("dtype", dtype_name(layout.dtype));
  s += field("layers", std::to_string(layout.num_layers));
  s += field("latent", std::to_string(layout.latent_dim));
  s += field("rope", std::to_string(layout.rope_dim));
  s += field("block", std::to_string(layout.block_size));
  s += field("layout", std::to_string(layout_version));
  if (mtp_kv) s += field("mtp", "1");
  if (!compute.empty()) s += field("compute", compute);
  return s;
}

BlockHash KvNamespace::root_hash() const {
  return root_block_hash(canonical_identity());
}

std::string model_identity(std::string_view config_json, std::string_view weights_id) {
  const std::string text = "config=" + std::to_string(config_json.size()) + ":" +
                           std::string(config_json) + ";weights=" + std::string(weights_id);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(root_block_hash(text)));
  return std::string("m") + hex;
}

}  // namespace peerserve
