// Array conversions between bf16 and fp32. They agree bit for bit with bf16_to_float and
// float_to_bf16 in tensor/float_convert.h (round to nearest even; NaN stays a quiet NaN;
// subnormals are rounded, not flushed).
#pragma once

#include <cstdint>

#include "tensor/float_convert.h"

namespace peerserve::kernels {

void bf16_to_fp32(const bf16* src, float* dst, int64_t n);
void fp32_to_bf16(const float* src, bf16* dst, int64_t n);

// dst[i] = bf16_to_float(float_to_bf16(src[i])): fp32 values rounded to bf16 precision.
// dst may equal src.
void round_to_bf16(const float* src, float* dst, int64_t n);

}  // namespace peerserve::kernels
