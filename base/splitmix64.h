// SplitMix64 (Steele, Lea and Flood 2014): a 64-bit generator whose output is fixed by its
// seed on every platform and compiler. Its output function is a bijective avalanche over 64
// bits, also used alone as a counter-based hash (state = base + gamma * (counter + 1)).
#pragma once

#include <cstdint>

namespace peerserve {

// The generator's increment (the odd integer nearest 2^64 / golden ratio).
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// The output for an already incremented state z.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Advances `state` by the increment and returns the output: the generator's next value.
constexpr uint64_t splitmix64_next(uint64_t& state) {
  return splitmix64_mix(state += kSplitMix64Gamma);
}

}  // namespace peerserve
