#include "kernels/quantize_rows.h"

#include <cmath>

#include "base/check.h"

namespace peerserve::kernels {

void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t x_stride, int8_t* q,
                        float* scales) {
  PS_CHECK(rows >= 0 && cols >= 0 && x_stride >= cols)
      << rows << "x" << cols << " stride " << x_stride;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * x_stride;
    float amax = 0.0f;
    for (int64_t k = 0; k < cols; ++k) amax = std::fmax(amax, std::fabs(row[k]));
    PS_CHECK(std::isfinite(amax)) << "quantize_rows_int8: row " << i << " is not finite";
    int8_t* out = q + i * cols;
    if (amax == 0.0f) {
      scales[i] = 0.0f;
      for (int64_t k = 0; k < cols; ++k) out[k] = 0;
      continue;
    }
    scales[i] = amax / 127.0f;
    const float inverse = 127.0f / amax;
    for (int64_t k = 0; k < cols; ++k) {
      // |row[k] * inverse| <= 127 up to one rounding; the clamp keeps it in range.
      const float v = std::nearbyint(row[k] * inverse);
      out[k] = static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, v)));
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
