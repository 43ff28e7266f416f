#include "kv/latent_kv_cache.h"

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "base/check.h"
#include "tensor/float_convert.h"

namespace peerserve {

Result<LatentKvCache> LatentKvCache::create(const KvLayout& layout, int64_t num_blocks) {
  PS_RETURN_IF_ERROR(layout.validate());
  if (num_blocks <= 0) {
    return invalid_argument("KV cache: num_blocks = " + std::to_string(num_blocks) +
                            ", expected > 0");
  }
  const size_t block_bytes = layout.block_bytes();
  if (static_cast<size_t>(num_blocks) > std::numeric_limits<size_t>::max() / 2 / block_bytes) {
    return resource_exhausted("KV cache: " + std::to_string(num_blocks) + " blocks of " +
                              std::to_string(block_bytes) + " bytes overflow the address space");
  }
  const int64_t bytes = num_blocks * static_cast<int64_t>(block_bytes);
  Result<AlignedBuffer> data = AlignedBuffer::allocate(bytes);
  if (!data.ok()) {
    return resource_exhausted("KV cache: cannot allocate " + std::to_string(bytes) + " bytes (" +
                              std::to_string(num_blocks) + " blocks)");
  }
  return LatentKvCache(layout, num_blocks, std::move(data).value());
}

size_t LatentKvCache::offset(int64_t layer, int64_t block_id) const {
  PS_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  PS_CHECK(block_id >= 0 && block_id < num_blocks_) << "block " << block_id;
  return static_cast<size_t>(block_id) * layout_.block_bytes() +
         static_cast<size_t>(layer) * layout_.layer_block_bytes();
}

const std::byte* LatentKvCache::layer_block(int64_t layer, int64_t block_id) const {
  return data_.data() + offset(layer, block_id);
}

std::byte* LatentKvCache::mutable_layer_block(int64_t layer, int64_t block_id) {
  return data_.data() + offset(layer, block_id);
}

std::span<const std::byte> LatentKvCache::block_bytes(int64_t block_id) const {
  return {data_.data() + offset(0, block_id), layout_.block_bytes()};
}

std::span<std::byte> LatentKvCache::mutable_block_bytes(int64_t block_id) {
  return {data_.data() + offset(0, block_id), layout_.block_bytes()};
}

void LatentKvCache::write_token(int64_t layer, int64_t block_id, int64_t slot,
                                std::span<const float> c_kv, std::span<const float> k_pe) {
  PS_CHECK(slot >= 0 && slot < layout_.block_size) << "slot " << slot;
  PS_CHECK_EQ(static_cast<int64_t>(c_kv.size()), layout_.latent_dim);
  PS_CHECK_EQ(static_cast<int64_t>(k_pe.size()), layout_.rope_dim);
  const int64_t width = layout_.token_width();
  std::byte* row = mutable_layer_block(layer, block_id) +
                   static_cast<size_t>(slot * width) * dtype_size(layout_.dtype);
  if (layout_.dtype == DType::kF32) {
    auto* dst = reinterpret_cast<float*>(row);
    std::memcpy(dst, c_kv.data(), c_kv.size() * sizeof(float));
    std::memcpy(dst + c_kv.size(), k_pe.data(), k_pe.size() * sizeof(float));
  } else {
    auto* dst = reinterpret_cast<bf16*>(row);
    for (size_t i = 0; i < c_kv.size(); ++i) dst[i] = float_to_bf16(c_kv[i]);
    for (size_t i = 0; i < k_pe.size(); ++i) dst[c_kv.size() + i] = float_to_bf16(k_pe[i]);
  }
}

void LatentKvCache::read_token(int64_t layer, int64_t block_id, int64_t slot,
                               std::span<float> out) const {
  PS_CHECK(slot >= 0 && slot < layout_.block_size) << "slot " << slot;
  const int64_t width = layout_.token_width();
  PS_CHECK_EQ(static_cast<int64_t>(out.size()), width);
  const std::byte* row =
      layer_block(layer, block_id) + static_cast<size_t>(slot * width) * dtype_size(layout_.dtype);
  if (layout_.dtype == DType::kF32) {
    std::memcpy(out.data(), row, out.size() * sizeof(float));
  } else {
    const auto* src = reinterpret_cast<const bf16*>(row);
    for (int64_t i = 0; i < width; ++i) out[i] = bf16_to_float(src[i]);
  }
}

}  // namespace peerserve
