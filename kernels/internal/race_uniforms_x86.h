// The x86 loops of race_candidates (kernels/race_uniforms.h): AVX-512 in
// kernels/x86/avx512_race.cc, AVX2 in kernels/x86/avx2_race.cc, each built for its ISA. Call
// one only when the active ISA level is at least its level. They cover [0, n rounded down to
// their width) and return how many tokens they wrote; the caller does the rest.
#pragma once

#include <cstddef>
#include <cstdint>

namespace peerserve::kernels::internal {

size_t race_candidates_avx512(const float* weight, size_t n, uint64_t base, double bar,
                              uint32_t* out);
size_t race_candidates_avx2(const float* weight, size_t n, uint64_t base, double bar,
                            uint32_t* out);

}  // namespace peerserve::kernels::internal
