#include "kernels/quantize_rows.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "base/check.h"
#include "kernels/cpu_features.h"
#include "kernels/internal/quantize_rows_x86.h"

namespace peerserve::kernels {

void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t x_stride, int8_t* q,
                        float* scales) {
  PS_CHECK(rows >= 0 && cols >= 0 && x_stride >= cols)
      << rows << "x" << cols << " stride " << x_stride;
  // AVX-512 or AVX2 loops where active (bitwise the same results); otherwise branch-free element
  // loops that the compiler vectorizes (this file is built with -O3).
  // Adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to the nearest integer, ties to
  // even, in the default rounding mode (what nearbyint does, without a library call).
  constexpr float kRound = 12582912.0f;
  const bool avx512 = active_isa_level() >= IsaLevel::kAvx512;
  const bool avx2 = !avx512 && active_isa_level() >= IsaLevel::kAvx2;
  const bool simd = avx512 || avx2;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * x_stride;
    // max |x| as the max of the sign-cleared bit patterns: for non-negative floats the
    // integer order is the float order, and inf/NaN patterns are the largest.
    uint32_t max_bits = 0;
    if (avx512) max_bits = internal::max_abs_bits_avx512(row, cols);
    if (avx2) max_bits = internal::max_abs_bits_avx2(row, cols);
    for (int64_t k = 0; k < cols && !simd; ++k) {
      const uint32_t bits = std::bit_cast<uint32_t>(row[k]) & 0x7fffffffu;
      max_bits = max_bits < bits ? bits : max_bits;
    }
    int8_t* out = q + i * cols;
    if (max_bits >= 0x7f800000u) {
      scales[i] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t c = 0; c < cols; ++c) out[c] = 0;
      continue;
    }
    const float amax = std::bit_cast<float>(max_bits);
    if (amax == 0.0f) {
      scales[i] = 0.0f;
      for (int64_t c = 0; c < cols; ++c) out[c] = 0;
      continue;
    }
    scales[i] = amax / 127.0f;
    // Finite unless amax is below 127 / FLT_MAX (~4e-37): then divide element by element.
    const float inverse = 127.0f / amax;
    if (!std::isfinite(inverse)) {
      for (int64_t c = 0; c < cols; ++c) {
        out[c] = static_cast<int8_t>(std::nearbyint(row[c] / amax * 127.0f));
      }
      continue;
    }
    if (avx512) {
      internal::scale_round_int8_avx512(row, cols, inverse, out);
      continue;
    }
    if (avx2) {
      internal::scale_round_int8_avx2(row, cols, inverse, out);
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      // |row[c] * inverse| <= amax * fl(127 / amax) <= 127 (1 + 2^-22), which rounds to at
      // most 127: no clamp needed (and none in the loop keeps it vectorizable).
      const float v = (row[c] * inverse + kRound) - kRound;
      out[c] = static_cast<int8_t>(static_cast<int32_t>(v));
    }
  }
}

void dequantize_rows_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                          float* x, int64_t x_stride) {
  PS_CHECK(rows >= 0 && cols >= 0 && x_stride >= cols)
      << rows << "x" << cols << " stride " << x_stride;
  for (int64_t i = 0; i < rows; ++i) {
    const int8_t* in = q + i * cols;
    float* out = x + i * x_stride;
    const float scale = scales[i];
    for (int64_t k = 0; k < cols; ++k) out[k] = static_cast<float>(in[k]) * scale;
  }
}

}  // namespace peerserve::kernels
