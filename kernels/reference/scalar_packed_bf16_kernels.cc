// Scalar packed-bf16 kernel: the reference the SIMD level is tested against, and the
// product at levels without a fast packed kernel. Per output lane, k in order, one fp32
// addition per product (products of two bf16 are exact in fp32 unless subnormal, so a
// fused multiply-add gives the same bits wherever no product is below 2^-126).
#include <algorithm>
#include <bit>

#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kPanel = 16;

float widen(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

}  // namespace

void scalar_matmul_packed_bf16(const PackedBf16Tile& t) {
  for (int64_t i = 0; i < t.m; ++i) {
    const uint16_t* x = t.x + i * t.x_stride;
    float* y = t.y + i * t.y_stride;
    for (int64_t p = t.panel_begin; p < t.panel_end; ++p) {
      const uint16_t* w = t.w + p * t.panel_stride;
      float acc[kPanel] = {};
      for (int64_t g = 0; g < t.k_pairs; ++g) {
        const float x0 = widen(x[2 * g]), x1 = widen(x[2 * g + 1]);
        const uint16_t* wg = w + 2 * kPanel * g;
        for (int64_t l = 0; l < kPanel; ++l) {
          acc[l] += x0 * widen(wg[2 * l]);
          acc[l] += x1 * widen(wg[2 * l + 1]);
        }
      }
      const int64_t c0 = p * kPanel, count = std::min(kPanel, t.n - c0);
      for (int64_t l = 0; l < count; ++l) y[c0 + l] = t.accumulate ? y[c0 + l] + acc[l] : acc[l];
    }
  }
}

}  // namespace peerserve::kernels::internal
