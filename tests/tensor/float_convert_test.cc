// The scalar conversions every bf16/fp8 reference and SIMD kernel is checked against
// (tensor/float_convert.h), checked in turn against independent rules: the nearest
// representable value found by exact arithmetic in double, the compiler's _Float16, and
// literal codes from the OCP FP8 E4M3 table.
#include "tensor/float_convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace peerserve {
namespace {

// bf16 by its definition: the nearer of the two bf16 values around f (the truncation and
// the next one up in magnitude), the one with an even last bit on a tie; past the largest
// finite bf16 the next value up is infinity, at the distance 2^128 would have.
uint16_t nearest_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const auto magnitude = [](uint16_t bits) {
    if ((bits & 0x7fffu) == 0x7f80u) return std::ldexp(1.0, 128);
    return std::fabs(static_cast<double>(std::bit_cast<float>(uint32_t{bits} << 16)));
  };
  const double x = std::fabs(static_cast<double>(f));
  const double to_down = x - magnitude(down);
  const double to_up = magnitude(up) - x;
  if (to_down < to_up) return down;
  if (to_up < to_down) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(FloatConvertTest, Bf16IsTheNearestValueTiesToEven) {
  std::vector<uint32_t> patterns;
  // Every exponent and sign with the low halves that decide the rounding: exact, just below
  // a tie, ties with even and odd kept bits, just above, the largest.
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    if ((high & 0x7f80u) == 0x7f80u) continue;  // inf and NaN: below
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      patterns.push_back(high << 16 | low);
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    if ((u & 0x7f800000u) != 0x7f800000u) patterns.push_back(u);
  }
  int64_t ties = 0;
  for (uint32_t u : patterns) {
    const float f = std::bit_cast<float>(u);
    ties += (u & 0xffffu) == 0x8000u;
    ASSERT_EQ(float_to_bf16(f).bits, nearest_bf16(f)) << std::hex << "pattern 0x" << u;
  }
  EXPECT_GT(ties, 60000);
  // Largest finite floats round up to infinity; their ties too (0x7f7f8000: odd kept bit).
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80u);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7f8000u)).bits, 0x7f80u);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80u);  // tie, even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82u);  // tie, odd
  // Infinities stay, NaNs stay NaN (quiet), whatever their payload.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80u);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80u);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t b = float_to_bf16(std::bit_cast<float>(nan)).bits;
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16{b}))) << std::hex << nan;
    EXPECT_EQ(b & 0x40u, 0x40u) << "quiet bit of 0x" << std::hex << nan;
  }
  // bf16 -> float is exact: every bf16 comes back.
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = bf16_to_float(bf16{static_cast<uint16_t>(b)});
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, b) << std::hex << b;
  }
}

TEST(FloatConvertTest, HalfPrecisionAgreesWithTheCompiler) {
#if !defined(__FLT16_MAX__)
  GTEST_SKIP() << "this compiler has no _Float16 (clang 14 on x86); the GCC build runs it";
#else
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float ours = f16_to_float(static_cast<uint16_t>(h));
    const float compiler = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    if (std::isnan(compiler)) {
      EXPECT_TRUE(std::isnan(ours)) << std::hex << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(compiler))
          << std::hex << "half 0x" << h;
    }
  }
#endif
}

TEST(FloatConvertTest, Fp8E4M3DecodesAsTheOcpTable) {
  // Codes from the OCP 8-bit floating point specification (E4M3: bias 7, no infinity).
  EXPECT_EQ(f8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(f8e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(f8e4m3_to_float(0x7e), 448.0f);     // largest finite
  EXPECT_EQ(f8e4m3_to_float(0x08), 0x1p-6f);    // smallest normal
  EXPECT_EQ(f8e4m3_to_float(0x07), 0x1.cp-7f);  // largest subnormal, 7/8 * 2^-6
  EXPECT_EQ(f8e4m3_to_float(0x01), 0x1p-9f);    // smallest subnormal
  EXPECT_EQ(f8e4m3_to_float(0x3c), 1.5f);
  EXPECT_EQ(f8e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8e4m3_to_float(0x80)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0xff)));
  EXPECT_EQ(f8e4m3_to_float(0x78), 256.0f);  // exponent 15 is finite in E4M3
}

// fp8 by its definition: the nearest of the 127 non-negative finite codes to min(|f|, 448),
// the even code on a tie, with f's sign.
uint8_t nearest_f8e4m3(float f) {
  const double x = std::min(std::fabs(static_cast<double>(f)), 448.0);
  uint8_t best = 0;
  double best_distance = INFINITY;
  for (int code = 0; code <= 0x7e; ++code) {
    const double distance = std::fabs(f8e4m3_to_float(static_cast<uint8_t>(code)) - x);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = static_cast<uint8_t>(code);
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>((std::signbit(f) ? 0x80 : 0) | best);
}

TEST(FloatConvertTest, Fp8E4M3IsTheNearestCodeTiesToEvenSaturating) {
  std::vector<float> values;
  // Every code, every midpoint between neighbouring codes (ties), and just off each side.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = f8e4m3_to_float(static_cast<uint8_t>(code));
    const float hi = f8e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  for (float v : {448.0f, 460.0f, 464.0f, 500.0f, 1e30f, 1e-30f, 0x1p-10f, 0x1.8p-10f}) {
    values.push_back(v);
    values.push_back(-v);
  }
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> exponent(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    values.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  }
  for (float v : values) {
    ASSERT_EQ(float_to_f8e4m3(v), nearest_f8e4m3(v)) << "value " << v;
  }
  EXPECT_EQ(float_to_f8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_f8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_f8e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_f8e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);  // as torch
}

}  // namespace
}  // namespace peerserve
