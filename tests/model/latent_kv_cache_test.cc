// LatentKvCache: layout of blocks in memory, bf16 rounding, validation.
#include "kv/latent_kv_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

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

// The cache's whole buffer, built independently: token (layer, block, slot) starts at element
// ((block * num_layers + layer) * block_size + slot) * (latent_dim + rope_dim), its latent
// first, then its rope part; everything never written is zero.
template <typename Element, typename Convert>
std::vector<std::byte> expected_buffer(size_t total_bytes, Convert convert,
                                       const std::vector<std::array<int64_t, 3>>& where,
                                       const std::vector<std::vector<float>>& tokens) {
  std::vector<std::byte> buffer(total_bytes, std::byte{0});
  const KvLayout l = layout(DType::kF32);
  for (size_t t = 0; t < where.size(); ++t) {
    const auto [layer, block, slot] = where[t];
    const size_t first = static_cast<size_t>(
        ((block * l.num_layers + layer) * l.block_size + slot) * (l.latent_dim + l.rope_dim));
    for (size_t i = 0; i < tokens[t].size(); ++i) {
      const Element e = convert(tokens[t][i]);
      std::memcpy(buffer.data() + (first + i) * sizeof(Element), &e, sizeof(Element));
    }
  }
  return buffer;
}

std::vector<float> concat(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(LatentKvCacheTest, StoresTokensBlockMajorAndRoundsToBf16) {
  auto cache = LatentKvCache::create(layout(DType::kBF16), 5);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->layout().block_bytes(), 3u * 4 * 8 * 2);
  EXPECT_EQ(cache->total_bytes(), 5 * cache->layout().block_bytes());
  const std::vector<float> c_kv = {1.0f, 0.1f, -2.5f, 3.14159f, 1e-3f, 7.0f};
  const std::vector<float> k_pe = {0.333333f, -0.7f};
  const std::vector<float> c_kv2 = {-4.0f, 5.5f, 0.01f, -0.02f, 9.0f, -1.25f};
  const std::vector<float> k_pe2 = {2.0f, -3.0f};
  cache->write_token(/*layer=*/2, /*block=*/3, /*slot=*/1, c_kv, k_pe);
  cache->write_token(/*layer=*/0, /*block=*/4, /*slot=*/3, c_kv2, k_pe2);
  const std::byte* base = cache->block_bytes(0).data();
  EXPECT_EQ(cache->layer_block(2, 3), base + (3 * 3 + 2) * 4 * 8 * 2);
  // Every byte of the buffer, against the layout built above from the rounded values.
  const std::vector<std::byte> expected =
      expected_buffer<bf16>(cache->total_bytes(), [](float v) { return float_to_bf16(v); },
                            {{2, 3, 1}, {0, 4, 3}}, {concat(c_kv, k_pe), concat(c_kv2, k_pe2)});
  EXPECT_EQ(std::memcmp(base, expected.data(), expected.size()), 0);
  std::vector<float> back(8);
  cache->read_token(2, 3, 1, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], bf16_to_float(float_to_bf16(c_kv[i])));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(back[6 + i], bf16_to_float(float_to_bf16(k_pe[i])));
}

TEST(LatentKvCacheTest, Fp32CacheIsExact) {
  auto cache = LatentKvCache::create(layout(DType::kF32), 2);
  ASSERT_TRUE(cache.ok());
  const std::vector<float> c_kv = {1.0f, 0.1f, -2.5f, 3.14159f, 1e-3f, 7.0f};
  const std::vector<float> k_pe = {0.333333f, -0.7f};
  cache->write_token(0, 1, 3, c_kv, k_pe);
  const std::vector<std::byte> expected = expected_buffer<float>(
      cache->total_bytes(), [](float v) { return v; }, {{0, 1, 3}}, {concat(c_kv, k_pe)});
  EXPECT_EQ(std::memcmp(cache->block_bytes(0).data(), expected.data(), expected.size()), 0);
  std::vector<float> back(8);
  cache->read_token(0, 1, 3, back);
  EXPECT_EQ(back, concat(c_kv, k_pe));
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
