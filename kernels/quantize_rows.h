// Per-row symmetric INT8 quantization (the "early quantization" of expert-parallel
// dispatch: each token's hidden state travels as int8 with one fp32 scale).
//
//   scale[i] = max_k |x[i, k]| / 127   (0 for an all-zero row)
//   q[i, k]  = round_to_nearest_even(x[i, k] * (127 / max_k |x[i, k]|)), in [-127, 127]
//   x'[i, k] = q[i, k] * scale[i]       (dequantize)
//
// so |x' - x| <= scale / 2 (plus fp32 rounding of the two products). A row holding inf or
// NaN gets scale NaN and q all 0, so that it dequantizes to NaN, as the activations it came
// from would have carried on (a damaged checkpoint or an overflow is not a reason to end the
// process, nor to send plausible values). AVX-512 loops at IsaLevel::kAvx512 and above, AVX2 loops
// at kAvx2, plain loops otherwise, with bitwise the same results. Thread-safe (no state).
#pragma once

#include <cstdint>

namespace peerserve::kernels {

// x is [rows, cols] with row stride `x_stride` (elements, >= cols); q is dense
// [rows, cols]; scales has `rows` entries.
void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t x_stride, int8_t* q,
                        float* scales);

// x[i, k] = q[i, k] * scales[i]; q dense [rows, cols], x with row stride x_stride.
void dequantize_rows_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                          float* x, int64_t x_stride);

}  // namespace peerserve::kernels
