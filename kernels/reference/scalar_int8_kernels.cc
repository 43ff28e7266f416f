// Scalar int8 kernels: the reference the SIMD levels are tested against. Integer sums are
// exact, and the epilogue is the same three fp32 operations at every level (scale product,
// conversion times scale, optional add), so every level gives the same bits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kPanel = 16;

// y columns of panels [p, p + panels) for row i, from their 16 * panels int32 sums.
void finish_row(const Int8Tile& t, int64_t i, int64_t p, int64_t panels, const int32_t* acc) {
  const float xs = t.x_scale[i];
  if (t.epilogue == Int8Epilogue::kGateUpSilu) {
    float* out = static_cast<float*>(t.y) + i * t.y_stride;
    for (int64_t q = 0; q < panels; q += 2) {
      const int64_t c0 = (p + q) / 2 * kPanel;  // first output column of the pair
      const int64_t count = std::min<int64_t>(kPanel, t.n - c0);
      if (count <= 0) break;
      float gate[kPanel], up[kPanel];
      const int64_t gc = (p + q) * kPanel, uc = gc + kPanel;  // packed columns
      for (int64_t l = 0; l < kPanel; ++l) {
        gate[l] = static_cast<float>(acc[q * kPanel + l]) * (xs * t.w_scale[gc + l]);
        up[l] = static_cast<float>(acc[(q + 1) * kPanel + l]) * (xs * t.w_scale[uc + l]);
      }
      t.silu_mul(gate, up, out + c0, count);
    }
    return;
  }
  const int64_t c0 = p * kPanel;
  const int64_t count = std::min(panels * kPanel, t.n - c0);
  if (t.epilogue == Int8Epilogue::kInt32) {
    int32_t* y = static_cast<int32_t*>(t.y) + i * t.y_stride + c0;
    std::copy_n(acc, count, y);
    return;
  }
  float* y = static_cast<float*>(t.y) + i * t.y_stride + c0;
  for (int64_t l = 0; l < count; ++l) {
    const float v = static_cast<float>(acc[l]) * (xs * t.w_scale[c0 + l]);
    y[l] = t.accumulate ? y[l] + v : v;
  }
}

}  // namespace

void scalar_matmul_int8(const Int8Tile& t) {
  // Offset 0: x bytes are the signed quantized values.
  int32_t acc[kPanel];
  for (int64_t i = 0; i < t.m; ++i) {
    const int8_t* x = reinterpret_cast<const int8_t*>(t.x + i * t.x_stride);
    for (int64_t p = t.panel_begin; p < t.panel_end; p += 2) {
      const int64_t panels = std::min<int64_t>(2, t.panel_end - p);
      int32_t pair[2 * kPanel];
      for (int64_t q = 0; q < panels; ++q) {
        const int8_t* w = t.w + (p + q) * t.panel_stride;
        std::fill_n(acc, kPanel, 0);
        for (int64_t g = 0; g < t.k_groups; ++g) {
          for (int64_t l = 0; l < kPanel; ++l) {
            for (int64_t b = 0; b < 4; ++b) {
              acc[l] += int32_t{x[4 * g + b]} * int32_t{w[64 * g + 4 * l + b]};
            }
          }
        }
        std::copy_n(acc, kPanel, pair + q * kPanel);
      }
      finish_row(t, i, p, panels, pair);
    }
  }
}

float scalar_quantize_row_int8(const float* x, int64_t k, int64_t k_padded, uint8_t offset,
                               uint8_t* out) {
  // max |x| as the max of the sign-cleared bit patterns: for non-negative floats the integer
  // order is the float order, and inf/NaN patterns are the largest.
  uint32_t max_bits = 0;
  for (int64_t p = 0; p < k; ++p) {
    max_bits = std::max(max_bits, std::bit_cast<uint32_t>(x[p]) & 0x7fffffffu);
  }
  if (max_bits >= 0x7f800000u) return non_finite_row_int8(k_padded, offset, out);
  const float absmax = std::bit_cast<float>(max_bits);
  const float inv = absmax > 0.0f ? 127.0f / absmax : 0.0f;
  // absmax below 127 / FLT_MAX (~3.7e-37): the inverse overflows, so every level divides
  // element by element instead (the same fp32 operations everywhere).
  const bool divide = !std::isfinite(inv);
  for (int64_t p = 0; p < k; ++p) {
    // |scaled| <= 127 (1 + 2^-22): the clamp only keeps the rounding's edge in range.
    const float scaled = divide ? x[p] / absmax * 127.0f : x[p] * inv;
    const float q = std::fmin(std::fmax(std::nearbyint(scaled), -127.0f), 127.0f);
    out[p] = static_cast<uint8_t>(static_cast<int32_t>(q) + offset);
  }
  std::fill(out + k, out + k_padded, offset);
  return absmax / 127.0f;
}

}  // namespace peerserve::kernels::internal
