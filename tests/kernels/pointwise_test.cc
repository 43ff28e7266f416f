// rmsnorm, silu_mul, softmax, exp_offset, dot/axpy/scale/argmax and the bf16 conversions against
// independent references (double precision, a plain loop, or tensor/float_convert.h bit for
// bit) at every ISA level.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "kernel_test_support.h"
#include "kernels/activation.h"
#include "kernels/bf16_convert.h"
#include "kernels/rmsnorm.h"
#include "kernels/softmax.h"
#include "kernels/vector_ops.h"

namespace peerserve::kernels {
namespace {

using testing::kUnitRoundoff;
using testing::level_label;
using testing::levels_to_test;
using testing::Random;
using testing::summation_chain;

// Lengths with every tail for 8- and 16-lane loops, plus longer rows.
const int64_t kLengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 2048, 4099};

uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}

// Inputs that exercise the rounding rule: random bit patterns (NaNs, infinities,
// subnormals included) plus exact ties and values next to them.
std::vector<float> conversion_inputs(Random& rng, size_t n) {
  std::vector<float> v(n);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                               0x7f800001u, 0xffbfffffu, 0x00008000u, 0x00018000u, 0x3f808000u,
                               0x3f818000u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
                               0x007fffffu, 0x3f7fffffu};
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = i < std::size(specials) ? specials[i] : rng.bits();
    v[i] = std::bit_cast<float>(b);
  }
  return v;
}

TEST(Bf16Convert, AgreesBitForBitWithScalarDefinition) {
  Random rng(3);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    // Every bf16 bit pattern.
    std::vector<bf16> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<uint16_t>(i);
    std::vector<float> widened(65536 + 1, 0.0f);
    bf16_to_fp32(all.data(), widened.data(), 65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      ASSERT_EQ(bits_of(widened[i]), bits_of(bf16_to_float(all[i]))) << i;
    }
    for (int64_t n : kLengths) {
      const std::vector<float> src = conversion_inputs(rng, static_cast<size_t>(n));
      std::vector<bf16> narrow(static_cast<size_t>(n) + 1, bf16{0xabcd});
      fp32_to_bf16(src.data(), narrow.data(), n);
      std::vector<float> rounded(static_cast<size_t>(n) + 1, 7.0f);
      round_to_bf16(src.data(), rounded.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const bf16 expect = float_to_bf16(src[i]);
        ASSERT_EQ(narrow[i].bits, expect.bits)
            << "n=" << n << " i=" << i << " in=" << bits_of(src[i]);
        ASSERT_EQ(bits_of(rounded[i]), bits_of(bf16_to_float(expect))) << "n=" << n << " i=" << i;
      }
      EXPECT_EQ(narrow[n].bits, 0xabcd) << "wrote past the end";
      EXPECT_EQ(rounded[n], 7.0f) << "wrote past the end";
      // In place.
      std::vector<float> in_place = src;
      round_to_bf16(in_place.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(in_place[i]), bits_of(rounded[i]));
    }
    // Partial tails of the widening too.
    for (int64_t n : kLengths) {
      if (n > 65536) continue;
      std::vector<float> out(static_cast<size_t>(n) + 1, 7.0f);
      bf16_to_fp32(all.data() + 1000, out.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(out[i]), bits_of(widened[1000 + i]));
      EXPECT_EQ(out[n], 7.0f);
    }
  }
}

// The fast paths (AVX2: 16 values without a NaN; AVX512_BF16: 32 values without a NaN or a
// subnormal) must round ties, overflow to inf and pass infinities like the definition: each
// such value at every position of blocks that hold no NaN or subnormal.
TEST(Bf16Convert, SpecialValuesInsideBlocksWithoutNaNOrSubnormals) {
  Random rng(4);
  const uint32_t finite_specials[] = {
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f7fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
      0xff800000u, 0x00800000u, 0x80800000u, 0x00000000u, 0x80000000u, 0x4b7fff80u, 0xbf808000u};
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int position = 0; position < 64; ++position) {
      std::vector<float> src = rng.floats(64, -4, 4);  // normal values
      for (size_t s = 0; s < std::size(finite_specials); ++s) {
        src[static_cast<size_t>((position + 5 * s) % 64)] =
            std::bit_cast<float>(finite_specials[s]);
      }
      std::vector<bf16> narrow(64);
      fp32_to_bf16(src.data(), narrow.data(), 64);
      for (size_t i = 0; i < 64; ++i) {
        ASSERT_EQ(narrow[i].bits, float_to_bf16(src[i]).bits)
            << "position " << position << " in=" << std::hex << bits_of(src[i]);
      }
    }
  }
}

TEST(VectorOps, DotMatchesDoubleReference) {
  Random rng(5);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      const std::vector<float> a = rng.floats(static_cast<size_t>(n));
      const std::vector<float> b = rng.floats(static_cast<size_t>(n));
      const std::vector<bf16> c = rng.bf16s(static_cast<size_t>(n));
      double ref = 0, ref_bf16 = 0, mag = 0, mag_bf16 = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(a[i]) * b[i];
        mag += std::fabs(static_cast<double>(a[i]) * b[i]);
        ref_bf16 += static_cast<double>(a[i]) * bf16_to_float(c[i]);
        mag_bf16 += std::fabs(static_cast<double>(a[i]) * bf16_to_float(c[i]));
      }
      // Summation bound; products are rounded once more (or fused), hence +1.
      const double chain = summation_chain(level, n) + 1;
      EXPECT_NEAR(dot(a.data(), b.data(), n), ref, chain * kUnitRoundoff * mag) << n;
      EXPECT_NEAR(dot(a.data(), c.data(), n), ref_bf16, chain * kUnitRoundoff * mag_bf16) << n;
    }
    EXPECT_EQ(dot(static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), 0), 0.0f);
  }
}

TEST(VectorOps, AxpyAndScale) {
  Random rng(6);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      const float alpha = rng.uniform(-2, 2);
      const std::vector<float> x = rng.floats(static_cast<size_t>(n));
      const std::vector<bf16> xb = rng.bf16s(static_cast<size_t>(n));
      const std::vector<float> y0 = rng.floats(static_cast<size_t>(n) + 1);
      std::vector<float> y = y0, yb = y0, s = y0;
      axpy(alpha, x.data(), y.data(), n);
      axpy(alpha, xb.data(), yb.data(), n);
      scale(alpha, s.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        // Two roundings at most (multiply, add; or one fused).
        const double ref = y0[i] + static_cast<double>(alpha) * x[i];
        ASSERT_NEAR(y[i], ref, 2 * kUnitRoundoff * (std::fabs(y0[i]) + std::fabs(alpha * x[i])));
        const double ref_b = y0[i] + static_cast<double>(alpha) * bf16_to_float(xb[i]);
        ASSERT_NEAR(
            yb[i], ref_b,
            2 * kUnitRoundoff * (std::fabs(y0[i]) + std::fabs(alpha * bf16_to_float(xb[i]))));
        ASSERT_EQ(s[i], alpha * y0[i]);  // one correctly rounded multiply
      }
      EXPECT_EQ(y[n], y0[n]);
      EXPECT_EQ(yb[n], y0[n]);
      EXPECT_EQ(s[n], y0[n]);
    }
  }
}

// weighted_sum against a double reference and bit for bit against the axpy calls onto a
// zeroed row it replaces (an MoE combine); rows lie anywhere in one buffer, out past n stays.
TEST(VectorOps, WeightedSumMatchesAxpyChainAndReference) {
  Random rng(62);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      for (const int64_t count : {0, 1, 2, 6, 9}) {
        const int64_t slots = 11, stride = n + 3;
        const std::vector<float> pool = rng.floats(static_cast<size_t>(slots * stride));
        const std::vector<bf16> pool_b = rng.bf16s(static_cast<size_t>(slots * stride));
        const std::vector<float> w = rng.floats(static_cast<size_t>(count));
        std::vector<const float*> rows;
        std::vector<const bf16*> rows_b;
        for (int64_t j = 0; j < count; ++j) {
          const int64_t slot = (j * 7 + 3) % slots;  // scattered, out of order, some repeated
          rows.push_back(pool.data() + slot * stride + j % 3);
          rows_b.push_back(pool_b.data() + slot * stride + j % 3);
        }
        std::vector<float> out(static_cast<size_t>(n) + 1, 7.0f), out_b = out;
        weighted_sum(w.data(), rows.data(), count, out.data(), n);
        weighted_sum(w.data(), rows_b.data(), count, out_b.data(), n);
        std::vector<float> chain(static_cast<size_t>(n), 0.0f), chain_b = chain;
        for (int64_t j = 0; j < count; ++j) {
          axpy(w[j], rows[j], chain.data(), n);
          axpy(w[j], rows_b[j], chain_b.data(), n);
        }
        for (int64_t d = 0; d < n; ++d) {
          ASSERT_EQ(bits_of(out[d]), bits_of(chain[d])) << n << " " << count << " " << d;
          ASSERT_EQ(bits_of(out_b[d]), bits_of(chain_b[d])) << n << " " << count << " " << d;
          double ref = 0, mag = 0, ref_b = 0, mag_b = 0;
          for (int64_t j = 0; j < count; ++j) {
            ref += static_cast<double>(w[j]) * rows[j][d];
            mag += std::fabs(static_cast<double>(w[j]) * rows[j][d]);
            ref_b += static_cast<double>(w[j]) * bf16_to_float(rows_b[j][d]);
            mag_b += std::fabs(static_cast<double>(w[j]) * bf16_to_float(rows_b[j][d]));
          }
          const double chain_bound = 2.0 * static_cast<double>(count) * kUnitRoundoff;
          ASSERT_NEAR(out[d], ref, chain_bound * mag);
          ASSERT_NEAR(out_b[d], ref_b, chain_bound * mag_b);
        }
        EXPECT_EQ(out[n], 7.0f) << "wrote past the end";
        EXPECT_EQ(out_b[n], 7.0f) << "wrote past the end";
      }
    }
  }
}

// weighted_rows against a double reference (a chain of `tokens` multiply-adds per element)
// and bit for bit against the axpy calls it replaces; strides leave gaps that must stay
// untouched. Shapes cover the register blocks' row and column tails.
TEST(VectorOps, WeightedRowsMatchAxpyChainAndReference) {
  Random rng(61);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (const int64_t rows : {1, 3, 4, 5, 16}) {
      for (const int64_t dim : {1, 7, 8, 16, 24, 63, 64, 65, 256}) {
        for (const int64_t tokens : {1, 5, 16}) {
          const int64_t p_stride = tokens + 3, v_stride = dim + 5, o_stride = dim + 2;
          const std::vector<float> p = rng.floats(static_cast<size_t>(rows * p_stride));
          const std::vector<float> v = rng.floats(static_cast<size_t>(tokens * v_stride));
          const std::vector<bf16> vb = rng.bf16s(static_cast<size_t>(tokens * v_stride));
          const std::vector<float> o0 = rng.floats(static_cast<size_t>(rows * o_stride));
          std::vector<float> o = o0, ob = o0, chain = o0, chain_b = o0;
          weighted_rows(p.data(), p_stride, rows, v.data(), v_stride, tokens, o.data(), o_stride,
                        dim);
          weighted_rows(p.data(), p_stride, rows, vb.data(), v_stride, tokens, ob.data(), o_stride,
                        dim);
          for (int64_t j = 0; j < tokens; ++j) {
            for (int64_t r = 0; r < rows; ++r) {
              axpy(p[r * p_stride + j], v.data() + j * v_stride, chain.data() + r * o_stride, dim);
              axpy(p[r * p_stride + j], vb.data() + j * v_stride, chain_b.data() + r * o_stride,
                   dim);
            }
          }
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t d = 0; d < o_stride; ++d) {
              const int64_t i = r * o_stride + d;
              ASSERT_EQ(bits_of(o[i]), bits_of(chain[i])) << rows << " " << dim << " " << tokens;
              ASSERT_EQ(bits_of(ob[i]), bits_of(chain_b[i]));
              if (d >= dim) {
                ASSERT_EQ(bits_of(o[i]), bits_of(o0[i]));  // the gap is not written
                ASSERT_EQ(bits_of(ob[i]), bits_of(o0[i]));
                continue;
              }
              double ref = o0[i], mag = std::fabs(o0[i]), ref_b = o0[i], mag_b = std::fabs(o0[i]);
              for (int64_t j = 0; j < tokens; ++j) {
                const double pj = p[r * p_stride + j];
                ref += pj * v[j * v_stride + d];
                mag += std::fabs(pj * v[j * v_stride + d]);
                ref_b += pj * bf16_to_float(vb[j * v_stride + d]);
                mag_b += std::fabs(pj * bf16_to_float(vb[j * v_stride + d]));
              }
              // A chain of `tokens` multiply-adds: at most two roundings each.
              ASSERT_NEAR(o[i], ref, 2.0 * static_cast<double>(tokens) * kUnitRoundoff * mag);
              ASSERT_NEAR(ob[i], ref_b, 2.0 * static_cast<double>(tokens) * kUnitRoundoff * mag_b);
            }
          }
        }
      }
    }
  }
}

TEST(RmsNorm, MatchesDoubleReferenceWithBothWeightTypes) {
  Random rng(7);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t dim : kLengths) {
      const int64_t rows = 3, stride = dim + 5;
      const std::vector<float> x = rng.floats(static_cast<size_t>(rows * stride), -3, 3);
      const std::vector<float> wf = rng.floats(static_cast<size_t>(dim), 0.5f, 1.5f);
      const std::vector<bf16> wb = rng.bf16s(static_cast<size_t>(dim), 0.5f, 1.5f);
      std::vector<float> out_f(static_cast<size_t>(rows * dim)), out_b(out_f.size());
      RmsNormArgs args;
      args.x = x.data();
      args.x_stride = stride;
      args.rows = rows;
      args.dim = dim;
      args.eps = 1e-6f;
      args.out = out_f.data();
      rmsnorm(args, wf.data());
      args.out = out_b.data();
      rmsnorm(args, wb.data());
      // Relative error: half the sum-of-squares bound (through the square root), plus the
      // divide, sqrt, the eps add and the two multiplies.
      const double tol = (summation_chain(level, dim) / 2 + 6) * kUnitRoundoff;
      for (int64_t r = 0; r < rows; ++r) {
        double sum_sq = 0;
        for (int64_t i = 0; i < dim; ++i)
          sum_sq += static_cast<double>(x[r * stride + i]) * x[r * stride + i];
        const double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + 1e-6);
        for (int64_t i = 0; i < dim; ++i) {
          const double ref_f = x[r * stride + i] * inv * wf[i];
          const double ref_b = x[r * stride + i] * inv * bf16_to_float(wb[i]);
          ASSERT_NEAR(out_f[r * dim + i], ref_f, tol * std::fabs(ref_f) + 1e-30) << dim << " " << i;
          ASSERT_NEAR(out_b[r * dim + i], ref_b, tol * std::fabs(ref_b) + 1e-30) << dim << " " << i;
        }
      }
      // In place gives the same bits.
      std::vector<float> in_place = x;
      args.x = in_place.data();
      args.out = in_place.data();
      args.out_stride = stride;
      rmsnorm(args, wf.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(in_place[r * stride + i], out_f[r * dim + i]);
      }
    }
  }
}

TEST(SiluMul, MatchesDoubleReference) {
  Random rng(8);
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      std::vector<float> gate = rng.floats(static_cast<size_t>(n), -20, 20);
      if (n > 4) {
        gate[0] = 0.0f;
        gate[1] = -100.0f;  // exp(100) overflows fp32 in the scalar form; result ~ -0
        gate[2] = 100.0f;
        gate[3] = -87.5f;
      }
      if (n > 7) {  // exp(-g) between exp(88) and FLT_MAX (AVX2 once clamped it to exp(88))
        gate[4] = -88.3f;
        gate[5] = -88.5f;
        gate[6] = -88.72f;
      }
      const std::vector<float> up = rng.floats(static_cast<size_t>(n), -2, 2);
      std::vector<float> out(static_cast<size_t>(n) + 1, 7.0f);
      silu_mul(gate.data(), up.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i];
        const double ref = g / (1.0 + std::exp(-g)) * up[i];
        // exp within 2 ulp (the vector polynomial; libm is better), then add, divide,
        // multiply: 6 ulp relative, plus an absolute floor for subnormal results (g = -100:
        // exp(100) overflows in the scalar form, which returns -0 for ~-7e-42).
        ASSERT_NEAR(out[i], ref, 6 * 2 * kUnitRoundoff * std::fabs(ref) + 1e-40)
            << "g=" << g << " up=" << up[i];
      }
      EXPECT_EQ(out[n], 7.0f);
      std::vector<float> in_place = gate;
      silu_mul(in_place.data(), up.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in_place[i], out[i]);
    }
  }
}

TEST(Softmax, MatchesDoubleReferenceAndHandlesMasks) {
  Random rng(9);
  const float inf = std::numeric_limits<float>::infinity();
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      std::vector<float> x = rng.floats(static_cast<size_t>(n), -30, 10);
      if (n > 3) x[2] = -inf;  // a masked position
      std::vector<float> out = x;
      out.push_back(7.0f);
      softmax(out.data(), n);
      double max = -inf;
      for (float v : x) max = std::max<double>(max, v);
      double sum = 0;
      for (float v : x) sum += std::exp(v - max);
      for (int64_t i = 0; i < n; ++i) {
        if (x[i] == -inf) continue;  // checked exactly below
        const double ref = std::exp(x[i] - max) / sum;
        // x - max is rounded (error |x - max| u, which exp turns into a relative error of
        // the same size), exp within 2 ulp, the sum's bound, the reciprocal and multiply.
        const double rel = (std::fabs(x[i] - max) + summation_chain(level, n) + 6) * kUnitRoundoff;
        ASSERT_NEAR(out[i], ref, rel * ref + 1e-37) << "n=" << n << " i=" << i;
      }
      if (n > 3) {
        EXPECT_EQ(out[2], 0.0f);
      }
      EXPECT_EQ(out[n], 7.0f);
    }
    std::vector<float> masked(19, -inf);
    softmax(masked.data(), 19);
    for (float v : masked) EXPECT_EQ(v, 0.0f);
    std::vector<float> single = {3.5f};
    softmax(single.data(), 1);
    EXPECT_EQ(single[0], 1.0f);
    // A NaN is never taken for a masked row: [NaN], all NaN, NaN among -inf (body and tail)
    // and NaN among numbers all give NaN (the first three gave zeros).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::vector<float>> rows = {{nan}, std::vector<float>(19, nan), {1.0f, nan, 2.0f}};
    rows.push_back(std::vector<float>(19, -inf));
    rows.back()[17] = nan;
    for (std::vector<float>& row : rows) {
      softmax(row.data(), static_cast<int64_t>(row.size()));
      for (float v : row) EXPECT_TRUE(std::isnan(v)) << row.size();
    }
  }
}

// The first index of the largest non-NaN value, by a plain loop: what greedy decoding picks.
int64_t reference_argmax(const std::vector<float>& x) {
  int64_t best = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != x[i]) continue;  // NaN
    if (best < 0 || x[i] > x[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  return best < 0 ? 0 : best;
}

TEST(VectorOps, ArgmaxIsTheFirstLargestNonNaN) {
  Random rng(41);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      for (int variant = 0; variant < 8; ++variant) {
        std::vector<float> x(static_cast<size_t>(n));
        for (float& v : x) v = rng.uniform(-4.0f, 4.0f);
        const size_t at = static_cast<size_t>(rng.bits() % n);
        const size_t later = std::min(x.size() - 1, at + 1 + rng.bits() % 40);
        switch (variant) {
          case 1:  // a tie: the first of the two
            x[at] = 9.0f;
            x[later] = 9.0f;
            break;
          case 2:  // NaNs anywhere, one before the maximum
            for (size_t i = 0; i < x.size(); i += 3) x[i] = nan;
            x[at] = nan;
            break;
          case 3:  // all NaN: 0
            std::fill(x.begin(), x.end(), nan);
            break;
          case 4:  // all -inf but NaNs: the first -inf
            std::fill(x.begin(), x.end(), -inf);
            x[0] = nan;
            break;
          case 5:  // +inf wins, the first of two
            x[later] = inf;
            x[at] = inf;
            break;
          case 6:  // zeros of both signs as the maximum
            std::fill(x.begin(), x.end(), -1.0f);
            x[later] = 0.0f;
            x[at] = -0.0f;
            break;
          case 7:  // the maximum in the last element (the tail)
            x.back() = 100.0f;
            break;
          default:
            break;
        }
        EXPECT_EQ(argmax(x.data(), n), reference_argmax(x)) << "n " << n << " variant " << variant;
      }
    }
  }
  EXPECT_EQ(argmax(nullptr, 0), 0);
}

// exp(x - offset) against exp in double of the float difference: within 2 ulp (relative 2^-22)
// where the result is a normal float above 2^-125; below that (AVX2 flushes exp(-87) = 1.6e-38)
// within 2^-125; -inf gives 0 exactly, NaN gives NaN.
TEST(ExpOffset, MatchesDoubleExp) {
  Random rng(43);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    for (int64_t n : kLengths) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = rng.uniform(-120.0f, 12.0f);
      if (n > 2) {
        x[0] = -inf;
        x[1] = nan;
        x[2] = 12.0f;
      }
      const float offset = 9.5f;
      std::vector<float> out(static_cast<size_t>(n) + 1, 7.0f);
      exp_offset(x.data(), offset, out.data(), n);
      EXPECT_EQ(out[static_cast<size_t>(n)], 7.0f) << "wrote past n = " << n;
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[static_cast<size_t>(i)], got = out[static_cast<size_t>(i)];
        if (std::isnan(v)) {
          EXPECT_TRUE(std::isnan(got)) << i;
          continue;
        }
        // The difference rounded to float first, as the kernel takes it.
        const double want = std::exp(static_cast<double>(v - offset));
        if (want < 0x1p-125) {
          EXPECT_LE(std::fabs(got - want), 0x1p-125) << "x " << v;
        } else {
          EXPECT_LE(std::fabs(got - want), want * 0x1p-22) << "x " << v;
        }
        if (v == -inf) {
          EXPECT_EQ(got, 0.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace peerserve::kernels
