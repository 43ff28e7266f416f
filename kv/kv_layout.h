// Shape of the paged latent KV cache, as plain data: the cache never sees the model.
//
// MLA caches one latent vector per token per layer: [c_kv (latent_dim) ; k_pe (rope_dim)]
// (kv_lora_rank + qk_rope_head_dim values, 576 for DeepSeek-V3). Tokens are grouped into
// fixed-size blocks; a sequence owns a block table of block ids.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "tensor/dtype.h"

namespace peerserve {

struct KvLayout {
  int64_t num_layers = 0;      // layers that keep KV (decoder layers, then MTP layers)
  int64_t latent_dim = 0;      // kv_lora_rank
  int64_t rope_dim = 0;        // qk_rope_head_dim
  int64_t block_size = 16;     // tokens per block
  DType dtype = DType::kBF16;  // kBF16 (default, as served) or kF32 (exactness tests)

  // Values stored per token per layer.
  int64_t token_width() const { return latent_dim + rope_dim; }
  // Bytes of one layer of one block: [block_size, token_width].
  size_t layer_block_bytes() const {
    return static_cast<size_t>(block_size * token_width()) * dtype_size(dtype);
  }
  // Bytes of one block across all layers (the unit moved to and from a caching pool).
  size_t block_bytes() const { return layer_block_bytes() * static_cast<size_t>(num_layers); }
  // Blocks needed to hold `num_tokens` tokens.
  int64_t blocks_for_tokens(int64_t num_tokens) const {
    return (num_tokens + block_size - 1) / block_size;
  }

  // Checks that every field is positive and the dtype is kBF16 or kF32.
  Status validate() const;
};

}  // namespace peerserve
