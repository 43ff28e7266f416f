#include "model/checkpoint/deterministic_normal.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/splitmix64.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PS_NORMAL_SIMD 1
#include <immintrin.h>
#endif

// Results must not depend on whether the compiler fuses a*b+c into one FMA instruction.
// clang is told not to here. g++ contracts in C++ (its -ffp-contract=fast default; only ISO C
// turns it off) wherever the target has FMA: the scalar code is compiled for baseline x86-64,
// which has none, and the AVX-512/AVX2 kernels below turn contraction off themselves.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace peerserve {
namespace {

constexpr double kLn2 = 0.6931471805599453;
constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kTwoPi = 6.283185307179586;

// cos(x) and sin(x) for x in [0, pi/2) by their Taylor series; the first omitted term is
// below 1e-16 there.
double cos_poly(double x) {
  const double x2 = x * x;
  // Horner form of 1 - x^2/2! + x^4/4! - ... - x^22/22!
  double p = 1.0;
  for (int k = 22; k >= 2; k -= 2) p = 1.0 - x2 / (k * (k - 1)) * p;
  return p;
}

double sin_poly(double x) {
  const double x2 = x * x;
  double p = 1.0;
  // x * (1 - x^2/3! + x^4/5! - ... - x^22/23!)
  for (int k = 23; k >= 3; k -= 2) p = 1.0 - x2 / (k * (k - 1)) * p;
  return x * p;
}

// (quadrant, x) with 2*pi*t = quadrant * pi/2 + x, x in [0, pi/2).
void reduce_turns(double t, int& quadrant, double& x) {
  t -= std::floor(t);  // [0, 1), exact
  const double quarters = t * 4.0;
  quadrant = static_cast<int>(quarters) & 3;
  x = (quarters - quadrant) * (kTwoPi / 4.0);
}

constexpr uint64_t kGamma = kSplitMix64Gamma;

// next_uniform() from a 64-bit output: at most 2^53, so the signed conversion (one
// instruction) gives the same exact value as an unsigned one.
double uniform_of(uint64_t bits) {
  return static_cast<double>(static_cast<int64_t>((bits >> 11) + 1)) * 0x1p-53;
}

// One Box-Muller pair from its two uniforms, exactly as next_normal() computes it.
void box_muller_pair(double a, double t, double* out) {
  const double radius = std::sqrt(-2.0 * deterministic_log(a));
  out[0] = radius * deterministic_cos_2pi(t);
  out[1] = radius * deterministic_sin_2pi(t);
}

// Pairs [begin, end) of the stream whose state is `state` before pair 0: pair i takes the
// uniforms of outputs 2i and 2i+1 (states state + (2i+1) gamma, state + (2i+2) gamma) and
// writes its cosine and sine value to out[2i], out[2i+1].
void box_muller_pairs_scalar(uint64_t state, double* out, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const double a = uniform_of(splitmix64_mix(state + (2 * i + 1) * kGamma));
    const double t = uniform_of(splitmix64_mix(state + (2 * i + 2) * kGamma));
    box_muller_pair(a, t, out + 2 * i);
  }
}

#ifdef PS_NORMAL_SIMD
// box_muller_pairs_scalar for the W pairs from `first`, in GCC/Clang vector types, up to the
// square root: every lane does the same integer operations and the same IEEE additions,
// multiplications and divisions in the same order as the scalar code (next_uniform,
// deterministic_log, reduce_turns, cos_poly, sin_poly), so the results are identical;
// branches become selects. Sets minus_two_log (the square of the radius) and the cosine
// and sine of the angle. Domain facts used: the uniforms are in (0, 1], so a is a normal
// double (frexp from its bits) and floor(t) is 0 except for t == 1.
// Used only inside the target-specific functions below, which do the square root with
// their own instructions (always inlined, so the vector types never cross a call).
template <typename VD, typename VU, int W>
[[gnu::always_inline]] inline void box_muller_vector(uint64_t state, uint64_t first,
                                                     VD& minus_two_log, VD& cos_v, VD& sin_v) {
  constexpr uint64_t kExponentMagic = 0x4330000000000000;  // 2^52: low bits become the integer
  constexpr uint64_t kMantissaBits = 0x000fffffffffffff;
  constexpr uint64_t kOneBits = 0x3ff0000000000000;  // 1.0
  const VD zero = {};
  const VD one = zero + 1.0;
  VU pair = {};
  for (int j = 0; j < W; ++j) pair[j] = first + static_cast<uint64_t>(j);
  // The two uniforms of each pair: next_uniform's (u + 1) * 2^-53 for u = output >> 11 <
  // 2^53, converted exactly (the magic number takes u >> 1 < 2^52; every sum is an integer
  // below 2^53 + 1, so no step rounds).
  VD uniform[2];
  for (uint64_t h = 0; h < 2; ++h) {
    VU z = state + (2 * pair + 1 + h) * kGamma;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    const VU u = (z ^ (z >> 31)) >> 11;
    const VD half = (VD)((u >> 1) | kExponentMagic) - 0x1p52;
    const VD odd = (VD)((u & 1) | kExponentMagic) - 0x1p52;
    uniform[h] = ((half * 2.0 + odd) + 1.0) * 0x1p-53;
  }

  // deterministic_log(a): m in [1, 2) and e from the bits, then m in [sqrt(2)/2, sqrt(2)).
  const VU bits = (VU)uniform[0];
  VD e = ((VD)((bits >> 52) | kExponentMagic) - 0x1p52) - 1023.0;
  VD m = (VD)((bits & kMantissaBits) | kOneBits);
  const auto above = m > kSqrt2;
  m = above ? m * 0.5 : m;
  e = above ? e + 1.0 : e;
  const VD sq = (m - 1.0) / (m + 1.0);
  const VD sq2 = sq * sq;
  VD p = zero + 1.0 / 27.0;
#pragma GCC unroll 16
  for (int k = 25; k >= 1; k -= 2) p = p * sq2 + 1.0 / k;
  minus_two_log = -2.0 * (e * kLn2 + 2.0 * sq * p);

  // reduce_turns(t): t - floor(t), then the quadrant and r in [0, pi/2).
  const VD turns = uniform[1] == 1.0 ? zero : uniform[1];
  const VD quarters = turns * 4.0;
  const VD quadrant = (quarters >= 1.0 ? one : zero) + (quarters >= 2.0 ? one : zero) +
                      (quarters >= 3.0 ? one : zero);
  const VD r = (quarters - quadrant) * (kTwoPi / 4.0);
  const VD r2 = r * r;
  VD cos_p = one;
#pragma GCC unroll 16
  for (int k = 22; k >= 2; k -= 2) cos_p = 1.0 - r2 / static_cast<double>(k * (k - 1)) * cos_p;
  VD sin_p = one;
#pragma GCC unroll 16
  for (int k = 23; k >= 3; k -= 2) sin_p = 1.0 - r2 / static_cast<double>(k * (k - 1)) * sin_p;
  sin_p = r * sin_p;

  const auto q0 = quadrant == 0.0, q1 = quadrant == 1.0, q2 = quadrant == 2.0;
  cos_v = q0 ? cos_p : q1 ? -sin_p : q2 ? -cos_p : sin_p;
  sin_v = q0 ? sin_p : q1 ? cos_p : q2 ? -sin_p : -cos_p;
}

// g++ contracts a*b+c into an FMA in C++ (-ffp-contract=fast is its default outside ISO C)
// wherever the target has FMA, which AVX-512 implies; clang obeys the pragma above.
#if defined(__clang__)
#define PS_NO_FP_CONTRACT
#else
#define PS_NO_FP_CONTRACT , optimize("fp-contract=off")
#endif

using Vd8 = double __attribute__((vector_size(64)));
using Vu8 = uint64_t __attribute__((vector_size(64)));
using Vd4 = double __attribute__((vector_size(32)));
using Vu4 = uint64_t __attribute__((vector_size(32)));

// box_muller_pairs_scalar(state, out, 0, n - n % 8).
__attribute__((target("avx512f,avx512dq") PS_NO_FP_CONTRACT)) void box_muller_avx512(uint64_t state,
                                                                                     double* out,
                                                                                     size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    Vd8 minus_two_log, c, s;
    box_muller_vector<Vd8, Vu8, 8>(state, i, minus_two_log, c, s);
    // Correctly rounded, as std::sqrt (the masked form: g++ 12 warns about the plain one's
    // undefined pass-through operand).
    const __m512d square = (__m512d)minus_two_log;
    const Vd8 radius = (Vd8)_mm512_mask_sqrt_pd(square, static_cast<__mmask8>(0xff), square);
    c = radius * c;
    s = radius * s;
    const Vd8 lo = __builtin_shufflevector(c, s, 0, 8, 1, 9, 2, 10, 3, 11);
    const Vd8 hi = __builtin_shufflevector(c, s, 4, 12, 5, 13, 6, 14, 7, 15);
    std::memcpy(out + 2 * i, &lo, sizeof(lo));
    std::memcpy(out + 2 * i + 8, &hi, sizeof(hi));
  }
}

// box_muller_pairs_scalar(state, out, 0, n - n % 4).
__attribute__((target("avx2") PS_NO_FP_CONTRACT)) void box_muller_avx2(uint64_t state, double* out,
                                                                       size_t n) {
  for (size_t i = 0; i + 4 <= n; i += 4) {
    Vd4 minus_two_log, c, s;
    box_muller_vector<Vd4, Vu4, 4>(state, i, minus_two_log, c, s);
    const Vd4 radius = (Vd4)_mm256_sqrt_pd((__m256d)minus_two_log);
    c = radius * c;
    s = radius * s;
    const Vd4 lo = __builtin_shufflevector(c, s, 0, 4, 1, 5);
    const Vd4 hi = __builtin_shufflevector(c, s, 2, 6, 3, 7);
    std::memcpy(out + 2 * i, &lo, sizeof(lo));
    std::memcpy(out + 2 * i + 4, &hi, sizeof(hi));
  }
}

// Lanes of the widest kernel this CPU runs (1: scalar only).
int cpu_simd_width() {
  static const int width = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
                               ? 8
                           : __builtin_cpu_supports("avx2") ? 4
                                                            : 1;
  return width;
}
#else
int cpu_simd_width() {
  return 1;
}
#endif

std::atomic<int> g_simd_width_cap{8};

int simd_width() {
  return std::min(cpu_simd_width(), g_simd_width_cap.load(std::memory_order_relaxed));
}

// box_muller_pairs_scalar(state, out, 0, n), with SIMD where the CPU has it.
void box_muller_pairs(uint64_t state, double* out, size_t n) {
  size_t done = 0;
  const int width = simd_width();
#ifdef PS_NORMAL_SIMD
  if (width == 8) {
    box_muller_avx512(state, out, n);
  } else if (width == 4) {
    box_muller_avx2(state, out, n);
  }
#endif
  if (width > 1) done = n - n % static_cast<size_t>(width);
  box_muller_pairs_scalar(state, out, done, n);
}

}  // namespace

int set_normal_simd_width_cap_for_testing(int width) {
  return g_simd_width_cap.exchange(width);
}

DeterministicNormal DeterministicNormal::at_normal_index(uint64_t seed, uint64_t index) {
  DeterministicNormal rng(seed + (index / 2) * 2 * kGamma);  // wraps as state_ does
  if (index % 2 == 1) rng.next_normal();  // the pair's cosine value; its sine is the spare
  return rng;
}

void DeterministicNormal::next_normals(std::span<double> out) {
  size_t i = 0;
  if (has_spare_ && !out.empty()) {
    out[i++] = spare_;
    has_spare_ = false;
  }
  const size_t pairs = (out.size() - i) / 2;
  box_muller_pairs(state_, out.data() + i, pairs);
  state_ += 2 * pairs * kGamma;
  i += 2 * pairs;
  if (i < out.size()) out[i] = next_normal();  // keeps the pair's sine as the spare
}

uint64_t DeterministicNormal::next_u64() {
  return splitmix64_next(state_);
}

double DeterministicNormal::next_uniform() {
  return uniform_of(next_u64());
}

double DeterministicNormal::next_normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller: two independent normals from two uniforms.
  const double radius =
      std::sqrt(-2.0 * deterministic_log(next_uniform()));  // sqrt is exact-rounded
  const double turns = next_uniform();
  spare_ = radius * deterministic_sin_2pi(turns);
  has_spare_ = true;
  return radius * deterministic_cos_2pi(turns);
}

double deterministic_log(double x) {
  PS_CHECK(x > 0.0 && std::isfinite(x)) << x;
  // x = m * 2^e with m in [1, 2) read from the bits (exact), then m in [sqrt(2)/2, sqrt(2)).
  int e = 0;
  double m = std::frexp(x, &e) * 2.0;  // frexp gives [0.5, 1); both steps are exact
  e -= 1;
  if (m > kSqrt2) {
    m *= 0.5;
    e += 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172: the series to s^27 is exact to
  // double precision.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 27.0;
  for (int k = 25; k >= 1; k -= 2) p = p * s2 + 1.0 / k;
  return e * kLn2 + 2.0 * s * p;
}

double deterministic_cos_2pi(double t) {
  int quadrant = 0;
  double x = 0.0;
  reduce_turns(t, quadrant, x);
  switch (quadrant) {
    case 0:
      return cos_poly(x);
    case 1:
      return -sin_poly(x);
    case 2:
      return -cos_poly(x);
    default:
      return sin_poly(x);
  }
}

double deterministic_sin_2pi(double t) {
  int quadrant = 0;
  double x = 0.0;
  reduce_turns(t, quadrant, x);
  switch (quadrant) {
    case 0:
      return sin_poly(x);
    case 1:
      return cos_poly(x);
    case 2:
      return -sin_poly(x);
    default:
      return -cos_poly(x);
  }
}

}  // namespace peerserve
