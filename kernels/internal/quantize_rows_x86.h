// The x86 inner loops of quantize_rows_int8 (kernels/quantize_rows.h): AVX-512 in
// kernels/x86/avx512_quantize.cc, AVX2 in kernels/x86/avx2_quantize.cc, each built for its
// ISA. Call one only when the active ISA level is at least its level. Results are bitwise
// those of the scalar loops.
#pragma once

#include <cstdint>

namespace peerserve::kernels::internal {

// max over k of the bits of |x[k]| (sign cleared): the float order for finite values,
// inf/NaN patterns largest.
uint32_t max_abs_bits_avx512(const float* x, int64_t n);
uint32_t max_abs_bits_avx2(const float* x, int64_t n);

// q[k] = round_to_nearest_even(x[k] * inverse) as int8 (|x[k] * inverse| <= 127.5).
void scale_round_int8_avx512(const float* x, int64_t n, float inverse, int8_t* q);
void scale_round_int8_avx2(const float* x, int64_t n, float inverse, int8_t* q);

}  // namespace peerserve::kernels::internal
