#include "model/checkpoint/deterministic_normal.h"

#include <bit>
#include <cmath>

#include "base/check.h"

// Results must not depend on whether the compiler fuses a*b+c into one FMA instruction. g++
// in ISO mode (-std=c++20) does not contract; clang does unless told not to.
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

}  // namespace

uint64_t DeterministicNormal::next_u64() {
  // SplitMix64 (Steele, Lea, Flood 2014).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double DeterministicNormal::next_uniform() {
  return static_cast<double>((next_u64() >> 11) + 1) * 0x1p-53;
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
