// The per-token activation quantization of a row whose largest magnitude is below
// 127 / FLT_MAX (~3.7e-37), where 127 / absmax overflows: each element divided by absmax
// instead, with the operations of the scalar reference (scalar_quantize_row_int8), so that
// every level gives the same bytes. Internal linkage on purpose (see
// internal/kernel_table.h).
#pragma once

#include <cmath>
#include <cstdint>

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

float divide_quantize_row_int8(const float* x, int64_t k, int64_t k_padded, float absmax,
                               uint8_t offset, uint8_t* out) {
  for (int64_t p = 0; p < k; ++p) {
    // The same clamp as the reference (the row is finite: its caller checked).
    const float q = std::fmin(std::fmax(std::nearbyint(x[p] / absmax * 127.0f), -127.0f), 127.0f);
    out[p] = static_cast<uint8_t>(static_cast<int32_t>(q) + offset);
  }
  for (int64_t p = k; p < k_padded; ++p) out[p] = offset;
  return absmax / 127.0f;
}

}  // namespace
}  // namespace peerserve::kernels::internal
