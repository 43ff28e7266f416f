// Scalar conversions between float and the narrow float formats of checkpoints.
// These are the reference definitions; SIMD kernels must agree with them bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace peerserve {

// bfloat16 stored as its raw 16 bits.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  return std::bit_cast<float>(uint32_t{v.bits} << 16);
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN. Same as torch's .to(bfloat16).
inline bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// IEEE half precision.
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);  // subnormal
  } else if (exp == 31) {
    value = mant ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

// OCP FP8 E4M3 ("float8_e4m3fn"): bias 7, no infinities, 0x7f/0xff are NaN, max 448.
inline float f8e4m3_to_float(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else if (exp == 15 && mant == 7) {
    value = NAN;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -value : value;
}

// Round to nearest even, saturating to +-448 (what torch's .to(float8_e4m3fn) does for
// finite inputs within range; we saturate rather than produce NaN for out-of-range values).
uint8_t float_to_f8e4m3(float f);

}  // namespace peerserve
