// KvNamespace: what makes a cached KV block reusable at all, as plain data.
//
// A KV block is only valid for the exact weights that produced it (model identity), the byte
// layout it is stored in (KvLayout: layers, latent and rope widths, tokens per block, dtype,
// plus a layout version for changes the struct cannot see) and, for isolation, the tenant
// that computed it. All of it is folded into the root of the block hash chain
// (root_hash()), so chains of two namespaces differ from their first block on: a shared pool
// keyed by these hashes can never return a block of another model, layout or tenant for a
// lookup, even before the pool's own per-tenant separation (the tenant is also part of every
// pool key, see cache/pool_key.h).
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "kv/kv_layout.h"
#include "kv/prefix_hash.h"

namespace peerserve {

// Version of the byte layout of one KV block as stored in a pool: [layer][token][latent;rope]
// in `dtype`. Bump when that order changes without a KvLayout field changing.
inline constexpr uint32_t kKvBlockLayoutVersion = 1;

struct KvNamespace {
  std::string tenant = "default";  // isolation domain: 1-64 of [A-Za-z0-9._-]
  std::string model_id;            // identity of the weights, e.g. from model_identity()
  KvLayout layout;                 // geometry and dtype of a block
  uint32_t layout_version = kKvBlockLayoutVersion;
  // Whether the engines write the MTP layer's KV slot (speculative decoding configured): an
  // engine that does not leaves it unwritten, so its blocks are no use to one that drafts.
  // (Their chains differ anyway, kv/prefix_hash.h's lookahead; this makes a mismatch of two
  // instances an error at start-up.) Part of the identity only when set, so identities of
  // engines without speculation, and the pools persisted under them, stay as they were.
  bool mtp_kv = false;
  // How the engine computes beyond the checkpoint's weights when that changes the KV: "w8a8"
  // for INT8 weights quantized at load (--quantize int8 quantizes kv_a, which writes the
  // latent), "+fp32" added for fp32 GEMM activations, "+draft-w8a8" for an MTP layer (whose KV
  // is stored with mtp_kv) given INT8 forms the loaded weights lacked by the INT8 drafter,
  // "+ep-int8" / "+ep-bf16" for expert parallelism with that dispatch dtype, "+attn-plain" /
  // "+attn-absorbed" for a fixed attention form.
  // Empty (the default, BF16 products on the stored weights) adds nothing to the identity, so
  // default identities stay as they were.
  std::string compute;

  // Errors name the field: a bad tenant name, an empty model id, an invalid layout.
  Status validate() const;

  // A canonical, unambiguous description of every field ("peerserve-kv/1;tenant=...;...").
  std::string canonical_identity() const;

  // The root of this namespace's block hash chains: root_block_hash(canonical_identity()).
  BlockHash root_hash() const;
};

// Checks a tenant (pool namespace) name: 1 to 64 characters from [A-Za-z0-9._-], so that it
// can name a directory and a metric label as it is. The error names the offending input.
Status validate_tenant_name(std::string_view name);

// A model identity string: "m" + 16 hex digits of a hash over the model's config.json text
// and a weights id (e.g. the checkpoint's index file or a version tag). Two checkpoints with
// the same config but different weights must pass different weights ids.
std::string model_identity(std::string_view config_json, std::string_view weights_id);

}  // namespace peerserve
