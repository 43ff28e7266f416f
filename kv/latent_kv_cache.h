// The paged latent KV cache: a fixed pool of blocks, each holding `block_size` token slots
// for every layer of the layout.
//
// Memory order is block-major: block -> layer -> slot -> [c_kv ; k_pe]. A whole block (all
// layers) is one contiguous byte range, so it can be copied to or from a caching pool in
// one piece; one layer of one block is a contiguous [block_size, token_width] matrix that
// the attention reads row by row.
//
// Block ids are chosen by the caller (the block pool in kv/block_pool.h hands them out);
// this class only stores values. Thread-safety: concurrent writes to different slots and
// concurrent reads are fine; a slot must not be read while it is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "base/aligned_buffer.h"
#include "base/status.h"
#include "kv/kv_layout.h"

namespace peerserve {

class LatentKvCache {
 public:
  // Allocates num_blocks blocks (zero-filled). Errors on an invalid layout or a size that
  // does not fit in memory.
  static Result<LatentKvCache> create(const KvLayout& layout, int64_t num_blocks);

  LatentKvCache(LatentKvCache&&) noexcept = default;
  LatentKvCache& operator=(LatentKvCache&&) noexcept = default;

  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  size_t total_bytes() const { return static_cast<size_t>(num_blocks_) * layout_.block_bytes(); }

  // Stores one token's latent entry (converted to the cache dtype).
  // REQUIRES: layer < num_layers, block_id < num_blocks, slot < block_size,
  // c_kv.size() == latent_dim, k_pe.size() == rope_dim.
  void write_token(int64_t layer, int64_t block_id, int64_t slot, std::span<const float> c_kv,
                   std::span<const float> k_pe);
  // Reads one token's entry as floats into out (size token_width).
  void read_token(int64_t layer, int64_t block_id, int64_t slot, std::span<float> out) const;

  // Raw [block_size, token_width] matrix of `layer` in block `block_id`, in layout().dtype.
  const std::byte* layer_block(int64_t layer, int64_t block_id) const;
  std::byte* mutable_layer_block(int64_t layer, int64_t block_id);
  // The whole block (layout().block_bytes() bytes), e.g. to save it to a caching pool.
  std::span<const std::byte> block_bytes(int64_t block_id) const;
  std::span<std::byte> mutable_block_bytes(int64_t block_id);

 private:
  LatentKvCache(const KvLayout& layout, int64_t num_blocks, AlignedBuffer data)
      : layout_(layout), num_blocks_(num_blocks), data_(std::move(data)) {}
  size_t offset(int64_t layer, int64_t block_id) const;

  KvLayout layout_;
  int64_t num_blocks_ = 0;
  AlignedBuffer data_;  // every block, zero-filled at creation
};

}  // namespace peerserve
