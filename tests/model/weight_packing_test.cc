// The absorbed attention's per-head W_UK and W_UV packed at load
// (pack_absorbed_attention_bf16): each packed head multiplies like the slice of kv_b (or of
// its transposed W_UK copy) that the checkpoint-layout path reads.
#include "model/weight_packing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/matmul_packed_bf16.h"
#include "model/checkpoint/checkpoint.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

// y = x w^T over [rows, cols] bf16 rows of `w` (row stride `stride`), bf16 inputs.
std::vector<float> checkpoint_product(const std::vector<float>& x, int64_t m, const bf16* w,
                                      int64_t rows, int64_t cols, int64_t stride) {
  std::vector<float> y(static_cast<size_t>(m * rows));
  kernels::MatmulBf16Args a;
  a.x = x.data();
  a.w = w;
  a.w_stride = stride;
  a.y = y.data();
  a.m = m;
  a.n = rows;
  a.k = cols;
  kernels::matmul_bf16(a, kernels::ActivationPrecision::kBf16, nullptr);
  return y;
}

std::vector<float> packed_product(const std::vector<float>& x, int64_t m,
                                  const kernels::PackedBf16Matrix& w) {
  std::vector<float> y(static_cast<size_t>(m * w.rows()));
  kernels::matmul_packed_bf16({.x = x.data(), .w = &w, .y = y.data(), .m = m}, nullptr);
  return y;
}

TEST(WeightPackingTest, AbsorbedAttentionHeadsMultiplyLikeTheirKvBSlices) {
  auto checkpoint = Checkpoint::open(testing::tiny_checkpoint_dir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  const ModelConfig& c = checkpoint->config();
  auto loaded = load_deepseek_weights(*checkpoint, /*load_mtp=*/true, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  DeepseekWeights& weights = *loaded;
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t lora = c.kv_lora_rank;
  // The W_UK copies before packing frees them.
  std::vector<std::vector<bf16>> w_uk_t;
  for (const DecoderLayerWeights& layer : weights.layers) w_uk_t.push_back(layer.attention.w_uk_t);
  ASSERT_TRUE(pack_absorbed_attention_bf16(weights, c, nullptr).ok());

  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t m = 3;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const AttentionWeights& a = weights.layers[l].attention;
    ASSERT_EQ(static_cast<int64_t>(a.w_uk_packed.size()), heads);
    ASSERT_EQ(static_cast<int64_t>(a.w_uv_packed.size()), heads);
    EXPECT_TRUE(a.w_uk_t.empty()) << "W_UK's checkpoint-layout copy is freed once packed";
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<float> xk(static_cast<size_t>(m * nope)), xv(static_cast<size_t>(m * lora));
      for (float& e : xk) e = normal(rng);
      for (float& e : xv) e = normal(rng);
      // Same bf16 products, summed in another order: fp32 rounding apart.
      const std::vector<float> uk = packed_product(xk, m, *a.w_uk_packed[h]);
      const std::vector<float> uk_ref =
          checkpoint_product(xk, m, w_uk_t[l].data() + h * lora * nope, lora, nope, nope);
      const std::vector<float> uv = packed_product(xv, m, *a.w_uv_packed[h]);
      const std::vector<float> uv_ref =
          checkpoint_product(xv, m, a.kv_b.data + (h * (nope + v) + nope) * lora, v, lora, lora);
      ASSERT_EQ(uk.size(), uk_ref.size());
      ASSERT_EQ(uv.size(), uv_ref.size());
      for (size_t i = 0; i < uk.size(); ++i) {
        EXPECT_NEAR(uk[i], uk_ref[i], 1e-4f * (1.0f + std::abs(uk_ref[i])))
            << "layer " << l << " head " << h << " W_UK element " << i;
      }
      for (size_t i = 0; i < uv.size(); ++i) {
        EXPECT_NEAR(uv[i], uv_ref[i], 1e-4f * (1.0f + std::abs(uv_ref[i])))
            << "layer " << l << " head " << h << " W_UV element " << i;
      }
    }
  }
  ASSERT_TRUE(weights.mtp);
  EXPECT_EQ(static_cast<int64_t>(weights.mtp->layer.attention.w_uv_packed.size()), heads);
}

}  // namespace
}  // namespace peerserve
