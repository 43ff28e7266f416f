// LatentKvCache: layout of blocks in memory, bf16 rounding, validation.
#include "kv/latent_kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tensor/float_convert.h"

namespace peerserve {
namespace {

KvLayout layout(DType dtype) {
  KvLayout l;
  l.num_layers = 3;
  l.latent_dim = 6;
  l.rope_dim = 2;
  l.block_size = 4;
  l.dtype = dtype;
  return l;
}

TEST(LatentKvCacheTest, StoresTokensBlockMajorAndRoundsToBf16) {
  auto cache = LatentKvCache::create(layout(DType::kBF16), 5);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->layout().block_bytes(), 3u * 4 * 8 * 2);
  EXPECT_EQ(cache->total_bytes(), 5 * cache->layout().block_bytes());
  const std::vector<float> c_kv = {1.0f, 0.1f, -2.5f, 3.14159f, 1e-3f, 7.0f};
  const std::vector<float> k_pe = {0.333333f, -0.7f};
  cache->write_token(/*layer=*/2, /*block=*/3, /*slot=*/1, c_kv, k_pe);
  std::vector<float> back(8);
  cache->read_token(2, 3, 1, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], bf16_to_float(float_to_bf16(c_kv[i])));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(back[6 + i], bf16_to_float(float_to_bf16(k_pe[i])));
  // Block 3, layer 2, slot 1 starts at ((3 * 3 + 2) * 4 + 1) * 8 elements of the buffer.
  const std::byte* base = cache->block_bytes(0).data();
  EXPECT_EQ(cache->layer_block(2, 3), base + (3 * 3 + 2) * 4 * 8 * 2);
  bf16 stored;
  std::memcpy(&stored, base + ((3 * 3 + 2) * 4 + 1) * 8 * 2, 2);
  EXPECT_EQ(stored.bits, float_to_bf16(1.0f).bits);
  // Everything else is still zero.
  int nonzero = 0;
  for (std::byte b : std::span<const std::byte>(base, cache->total_bytes()))
    nonzero += b != std::byte{0};
  EXPECT_LE(nonzero, 16);
}

TEST(LatentKvCacheTest, Fp32CacheIsExact) {
  auto cache = LatentKvCache::create(layout(DType::kF32), 2);
  ASSERT_TRUE(cache.ok());
  const std::vector<float> c_kv = {1.0f, 0.1f, -2.5f, 3.14159f, 1e-3f, 7.0f};
  const std::vector<float> k_pe = {0.333333f, -0.7f};
  cache->write_token(0, 1, 3, c_kv, k_pe);
  std::vector<float> back(8);
  cache->read_token(0, 1, 3, back);
  EXPECT_EQ(std::vector<float>(back.begin(), back.begin() + 6), c_kv);
  EXPECT_EQ(back[7], -0.7f);
}

TEST(LatentKvCacheTest, RejectsBadLayouts) {
  KvLayout l = layout(DType::kBF16);
  l.block_size = 0;
  EXPECT_EQ(LatentKvCache::create(l, 4).status().code(), StatusCode::kInvalidArgument);
  l = layout(DType::kI8);
  const Status s = LatentKvCache::create(l, 4).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected BF16 or F32"), std::string::npos) << s.to_string();
  EXPECT_EQ(LatentKvCache::create(layout(DType::kF32), 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LatentKvCache::create(layout(DType::kF32), int64_t{1} << 60).status().code(),
            StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace peerserve
