// AVX2 int8 kernels: the W8A8 product with vpmaddubsw / vpmaddwd (also used by the AVX-512
// level on CPUs without VNNI). Compiled with -mavx2 -mfma -mf16c.
//
// Outer-product form over the packed layout of kernels/int8_matrix.h, as the VNNI kernel:
// a ymm accumulator holds 8 output columns (half a panel). vpmaddubsw multiplies unsigned
// by signed bytes and adds adjacent pairs into int16 WITH saturation, so it is fed
//   a = |x|            (activations are quantized to [-127, 127]: a in [0, 127])
//   b = sign(x) * q    (vpsignb; weights are in [-127, 127], -128 is refused at packing)
// Then a * b = x * q, and a pair sum is at most 2 * 127 * 127 = 32258 < 32767: it can never
// saturate. vpmaddwd with ones widens the pairs to int32 exactly; the int32 sums stay below
// 127 * 127 * 65536 < 2^31 (kMaxInt8Cols). Integer sums do not depend on order: every block
// shape and thread split gives the same bits, equal to the scalar reference.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/avx2_math.h"
#include "kernels/x86/divide_quantize_row.h"
#include "kernels/x86/row_blocks.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kPanel = 16;
// Register block: 2 rows x 2 panels (4 ymm halves each) = 8 accumulators, 4 weight loads,
// 2 broadcasts, 8 x (vpsignb, vpmaddubsw, vpmaddwd, vpaddd) per k group; 16 ymm registers
// leave no room for more.
constexpr int kBlockRows = 2;
constexpr int kBlockPanels = 2;
constexpr int kGemvPanels = 4;
constexpr int64_t kRowBlockBytes = 256 * 1024;
// Prefetch distance along each panel's weight stream, in 64-byte k groups; into L2 (measured
// faster than into L1: docs/kernels.md, "GEMV prefetch"). 32 here, twice the VNNI kernel's:
// at ~75 GB/s the AVX2 batch-1 step was 1.13x faster than with 16, at ~48 GB/s 1-3% (the
// VNNI kernel was 1-2% slower with 32).
constexpr int64_t kGemvPrefetchGroups = 32;

template <typename T>
constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

// The epilogue of row i over panels [p, p + np) (see the VNNI file; same operations).
void finish_row(const Int8Tile& t, int64_t i, int64_t p, int np, const int32_t* acc) {
  const __m256 xs = _mm256_set1_ps(t.x_scale[i]);
  auto scaled = [&](const int32_t* sums, int64_t c) {
    return _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums))),
        _mm256_mul_ps(xs, _mm256_loadu_ps(t.w_scale + c)));
  };
  if (t.epilogue == Int8Epilogue::kGateUpSilu) {
    float* out = static_cast<float*>(t.y) + i * t.y_stride;
    for (int q = 0; q < np; q += 2) {
      const int64_t c0 = (p + q) / 2 * kPanel;
      const int64_t count = min_of<int64_t>(kPanel, t.n - c0);
      if (count <= 0) break;
      const int64_t gc = (p + q) * kPanel, uc = gc + kPanel;
      alignas(32) float gate[kPanel], up[kPanel];
      for (int h = 0; h < 2; ++h) {
        _mm256_store_ps(gate + 8 * h, scaled(acc + q * kPanel + 8 * h, gc + 8 * h));
        _mm256_store_ps(up + 8 * h, scaled(acc + (q + 1) * kPanel + 8 * h, uc + 8 * h));
      }
      t.silu_mul(gate, up, out + c0, count);
    }
    return;
  }
  for (int h = 0; h < 2 * np; ++h) {
    const int64_t c = p * kPanel + 8 * h;
    const int64_t count = t.n - c;
    if (count <= 0) break;
    const __m256i mask = first_lanes(static_cast<int>(min_of<int64_t>(8, count)));
    if (t.epilogue == Int8Epilogue::kInt32) {
      _mm256_maskstore_epi32(static_cast<int32_t*>(t.y) + i * t.y_stride + c, mask,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + 8 * h)));
      continue;
    }
    float* y = static_cast<float*>(t.y) + i * t.y_stride + c;
    __m256 v = scaled(acc + 8 * h, c);
    if (t.accumulate) v = _mm256_add_ps(_mm256_maskload_ps(y, mask), v);
    _mm256_maskstore_ps(y, mask, v);
  }
}

// Rows [i0, i0 + MR) x panels [p, p + NP), all of k.
template <int MR, int NP, bool kPrefetch>
void block(const Int8Tile& t, int64_t i0, int64_t p) {
  constexpr int kHalves = 2 * NP;
  __m256i acc[MR][kHalves];
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < kHalves; ++h) acc[i][h] = _mm256_setzero_si256();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* w = t.w + p * t.panel_stride;
  const uint8_t* x = t.x + i0 * t.x_stride;
  for (int64_t g = 0; g < t.k_groups; ++g) {
    if constexpr (MR == 1) {
      // One row: each weight vector is used once, so it is loaded right where it is used.
      // Loading all of them first (as below) needs 8 + 8 + 3 ymm registers at 4 panels, and
      // GCC then kept every accumulator on the stack (a load and a store per product). No
      // step-time difference was measurable, but the loop is shorter.
      int32_t x4;
      std::memcpy(&x4, x + 4 * g, 4);
      const __m256i xb = _mm256_set1_epi32(x4);
      const __m256i ax = _mm256_abs_epi8(xb);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
        const int8_t* src = w + j * t.panel_stride + 64 * g;
        if constexpr (kPrefetch) {
          _mm_prefetch(reinterpret_cast<const char*>(src + 64 * kGemvPrefetchGroups), _MM_HINT_T1);
        }
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
          const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32 * half));
          const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xb));
          acc[0][2 * j + half] =
              _mm256_add_epi32(acc[0][2 * j + half], _mm256_madd_epi16(pairs, ones));
        }
      }
      continue;
    }
    __m256i wv[kHalves];
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const int8_t* src = w + j * t.panel_stride + 64 * g;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(src + 64 * kGemvPrefetchGroups), _MM_HINT_T1);
      }
      wv[2 * j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(src));
      wv[2 * j + 1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      int32_t x4;
      std::memcpy(&x4, x + i * t.x_stride + 4 * g, 4);
      const __m256i xb = _mm256_set1_epi32(x4);
      const __m256i ax = _mm256_abs_epi8(xb);
#pragma GCC unroll 8
      for (int h = 0; h < kHalves; ++h) {
        const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[h], xb));
        acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  // All sums to memory first, then the epilogue calls (no accumulator lives across a call).
  alignas(32) int32_t sums[MR][kHalves * 8];
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < kHalves; ++h) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums[i] + 8 * h), acc[i][h]);
    }
  }
  for (int i = 0; i < MR; ++i) finish_row(t, i0 + i, p, NP, sums[i]);
}

// block<rows, panels> for rows <= 2 and panels <= NP.
template <int MR, int NP, bool kPrefetch>
void block_panels(int panels, const Int8Tile& t, int64_t i0, int64_t p) {
  if constexpr (NP == 1) {
    block<MR, 1, kPrefetch>(t, i0, p);
  } else {
    if (panels == NP) {
      block<MR, NP, kPrefetch>(t, i0, p);
    } else {
      block_panels<MR, NP - 1, kPrefetch>(panels, t, i0, p);
    }
  }
}

// Quantizes 8 floats: round to nearest even, clamp, add the offset; 8 bytes.
inline void quantize8(__m256 v, __m256 inv, __m256i offset, uint8_t* out) {
  __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));  // NaN -> INT_MIN -> -127
  q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
  q = _mm256_add_epi32(q, offset);
  // The low byte of each int32 (as the scalar cast to uint8_t): int16 packing cannot
  // saturate (values in [-127, 255]), masking to 8 bits makes packus exact.
  __m256i q16 = _mm256_and_si256(_mm256_packs_epi32(q, q), _mm256_set1_epi16(0xff));
  const __m256i q8 = _mm256_packus_epi16(q16, q16);
  const int32_t lo = _mm256_extract_epi32(q8, 0), hi = _mm256_extract_epi32(q8, 4);
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &hi, 4);
}

}  // namespace

// One loop nest for every m, as the VNNI kernel (see there): row blocks, panel groups,
// 2-row steps; the first step of a group streams and prefetches its weights. A single row
// (decode) takes 4 panels per step: 8 accumulators, 4 weight streams in flight.
void avx2_matmul_int8(const Int8Tile& t) {
  const int64_t row_block = rows_per_block(t.m, t.x_stride, kRowBlockBytes, kBlockRows);
  const int64_t group = t.m == 1 ? kGemvPanels : kBlockPanels;
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    for (int64_t p = t.panel_begin; p < t.panel_end; p += group) {
      const int panels = static_cast<int>(min_of<int64_t>(group, t.panel_end - p));
      if (t.m == 1) {
        block_panels<1, kGemvPanels, true>(panels, t, 0, p);
        continue;
      }
      for (int64_t i = i0; i < i1; i += kBlockRows) {
        const bool first = i == i0;
        if (i1 - i >= 2) {
          first ? block_panels<2, kBlockPanels, true>(panels, t, i, p)
                : block_panels<2, kBlockPanels, false>(panels, t, i, p);
        } else {
          first ? block_panels<1, kBlockPanels, true>(panels, t, i, p)
                : block_panels<1, kBlockPanels, false>(panels, t, i, p);
        }
      }
    }
  }
}

float avx2_quantize_row_int8(const float* x, int64_t k, int64_t k_padded, uint8_t offset,
                             uint8_t* out) {
  // max |x| as the max of the sign-cleared bit patterns, as the scalar reference: inf/NaN
  // patterns are the largest, so a non-finite value is seen.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i vmax = _mm256_setzero_si256();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    vmax = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + p)), abs_mask),
                            vmax);
  }
  const int rest = static_cast<int>(k - p);
  if (rest > 0) {
    vmax = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(load_part(x + p, rest)), abs_mask),
                            vmax);
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  uint32_t max_bits = 0;
  for (uint32_t l : lanes) max_bits = l > max_bits ? l : max_bits;
  if (max_bits >= 0x7f800000u) return non_finite_row_int8(k_padded, offset, out);
  float absmax;
  std::memcpy(&absmax, &max_bits, sizeof absmax);
  const float inverse = absmax > 0.0f ? 127.0f / absmax : 0.0f;
  // Overflowed (absmax < 127 / FLT_MAX, ~3.7e-37): divide, exactly where the scalar
  // reference does (a looser bound divided rows it multiplies, with other roundings).
  constexpr float kFloatMax = std::numeric_limits<float>::max();  // folded: no call
  if (!(inverse <= kFloatMax)) {
    return divide_quantize_row_int8(x, k, k_padded, absmax, offset, out);
  }
  const __m256 inv = _mm256_set1_ps(inverse);
  const __m256i off = _mm256_set1_epi32(offset);
  for (p = 0; p + 8 <= k; p += 8) quantize8(_mm256_loadu_ps(x + p), inv, off, out + p);
  if (rest > 0) {
    uint8_t bytes[8];
    quantize8(load_part(x + p, rest), inv, off, bytes);
    std::memcpy(out + p, bytes, static_cast<size_t>(rest));
  }
  for (p = k; p < k_padded; ++p) out[p] = offset;
  return absmax / 127.0f;
}

}  // namespace peerserve::kernels::internal
