// AVX-512 inner loops of quantize_rows_int8 (kernels/quantize_rows.h), in
// kernels/x86/avx512_quantize.cc (built for AVX-512). Call only when the active ISA level is
// at least kAvx512. Results are bitwise those of the scalar loops.
#pragma once

#include <cstdint>

namespace peerserve::kernels::internal {

// max over k of the bits of |x[k]| (sign cleared): the float order for finite values,
// inf/NaN patterns largest.
uint32_t max_abs_bits_avx512(const float* x, int64_t n);

// q[k] = round_to_nearest_even(x[k] * inverse) as int8 (|x[k] * inverse| <= 127.5).
void scale_round_int8_avx512(const float* x, int64_t n, float inverse, int8_t* q);

}  // namespace peerserve::kernels::internal
