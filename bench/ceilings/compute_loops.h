// Register-resident and streaming loops behind machine_ceilings.cc, one file per ISA
// (compiled with that ISA's flags). Each returns a value derived from its work so that the
// compiler cannot drop it.
#pragma once

#include <cstdint>

namespace peerserve::bench::internal {

// Independent FMA chains: `iterations` x kFmaChains FMAs of the ISA's vector width.
inline constexpr int kFmaChains = 16;
float fma_loop_avx512(int64_t iterations);
float fma_loop_avx2(int64_t iterations);
float fma_loop_scalar(int64_t iterations);
// Independent vdpbf16ps chains: `iterations` x kFmaChains instructions.
float bf16_dot_loop_avx512(int64_t iterations);
// Independent vpdpbusd chains (64 u8 x s8 multiply-adds each): `iterations` x kFmaChains.
int32_t int8_dot_loop_avx512_vnni(int64_t iterations);
// The AVX2 int8 kernel's step on independent chains: vpsignb, vpmaddubsw, vpmaddwd, vpaddd
// (32 multiply-adds); `iterations` x kFmaChains steps.
int32_t int8_madd_loop_avx2(int64_t iterations);

// Sum of floats [begin, end) with wide loads; bandwidth-bound.
float read_sum_avx2(const float* begin, const float* end);
float read_sum_scalar(const float* begin, const float* end);

}  // namespace peerserve::bench::internal
