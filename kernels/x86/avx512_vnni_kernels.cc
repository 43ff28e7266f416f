// AVX512_VNNI kernels: the W8A8 product with vpdpbusd; everything else is the AVX-512 table.
// Compiled with -mavx512vnni (see internal/kernel_table.h for why nothing here calls
// inline code of shared headers other than the internal-linkage x86 ones).
//
// Outer-product form over the packed layout of kernels/int8_matrix.h: one zmm accumulator
// holds 16 output columns; each k group of 4 adds, per lane, the 4 products of the row's
// 4 activation bytes (broadcast) with the column's 4 weight bytes. vpdpbusd multiplies
// unsigned by signed bytes, so activations arrive as x + 128 (u8, 1..255) and the kernel
// subtracts 128 * sum_p q[c, p] (precomputed per column at packing): exact, because every
// partial sum fits in int32 (|sum| <= 255 * 127 * 65536 < 2^31, see kMaxInt8Cols).
// Integer sums do not depend on order, so every block shape, the GEMV and GEMM paths and
// any split over threads give the same bits (batch invariance for free).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/divide_quantize_row.h"
#include "kernels/x86/row_blocks.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kPanel = 16;
// GEMM register block: 6 rows x 4 panels (64 columns) = 24 accumulators, per k group
// 4 weight loads + 6 broadcasts for 24 vpdpbusd.
constexpr int kGemmRows = 6;
constexpr int kBlockPanels = 4;
// x rows (int8) kept in L2 while a group of 4 weight panels is reused from L1/L2.
constexpr int64_t kRowBlockBytes = 256 * 1024;
// Prefetch distance along each panel's weight stream, in 64-byte k groups; into L2 (measured
// faster than into L1: docs/kernels.md, "GEMV prefetch").
constexpr int64_t kGemvPrefetchGroups = 16;

template <typename T>
constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

// acc += vpdpbusd(x, w). Inline asm: GCC 12 keeps stack copies of the accumulators of the
// intrinsic in a 24-accumulator loop (a store per instruction); with asm the loop is loads
// and vpdpbusd only.
inline __m512i dpbusd(__m512i acc, __m512i x, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  return acc;
}

__mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << count) - 1u);
}

// The epilogue of row i over panels [p, p + np): acc holds np * 16 corrected int32 sums.
void finish_row(const Int8Tile& t, int64_t i, int64_t p, int np, const int32_t* acc) {
  const __m512 xs = _mm512_set1_ps(t.x_scale[i]);
  if (t.epilogue == Int8Epilogue::kGateUpSilu) {
    float* out = static_cast<float*>(t.y) + i * t.y_stride;
    for (int q = 0; q < np; q += 2) {
      const int64_t c0 = (p + q) / 2 * kPanel;
      const int64_t count = min_of<int64_t>(kPanel, t.n - c0);
      if (count <= 0) break;
      const int64_t gc = (p + q) * kPanel, uc = gc + kPanel;
      alignas(64) float gate[kPanel], up[kPanel];
      _mm512_store_ps(gate, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + q * kPanel)),
                                          _mm512_mul_ps(xs, _mm512_loadu_ps(t.w_scale + gc))));
      _mm512_store_ps(up,
                      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + (q + 1) * kPanel)),
                                    _mm512_mul_ps(xs, _mm512_loadu_ps(t.w_scale + uc))));
      t.silu_mul(gate, up, out + c0, count);
    }
    return;
  }
  for (int q = 0; q < np; ++q) {
    const int64_t c = (p + q) * kPanel;
    const int64_t count = t.n - c;
    if (count <= 0) break;
    const __mmask16 mask = first_lanes(count);
    const __m512i sums = _mm512_loadu_si512(acc + q * kPanel);
    if (t.epilogue == Int8Epilogue::kInt32) {
      _mm512_mask_storeu_epi32(static_cast<int32_t*>(t.y) + i * t.y_stride + c, mask, sums);
      continue;
    }
    float* y = static_cast<float*>(t.y) + i * t.y_stride + c;
    __m512 v =
        _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(xs, _mm512_loadu_ps(t.w_scale + c)));
    if (t.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
    _mm512_mask_storeu_ps(y, mask, v);
  }
}

// Rows [i0, i0 + MR) x panels [p, p + NP), all of k.
template <int MR, int NP, bool kPrefetch>
void block(const Int8Tile& t, int64_t i0, int64_t p) {
  __m512i acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  const int8_t* w = t.w + p * t.panel_stride;
  const uint8_t* x = t.x + i0 * t.x_stride;
  for (int64_t g = 0; g < t.k_groups; ++g) {
    __m512i wv[NP];
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const int8_t* src = w + j * t.panel_stride + 64 * g;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(src + 64 * kGemvPrefetchGroups), _MM_HINT_T1);
      }
      wv[j] = _mm512_load_si512(src);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t x4;
      std::memcpy(&x4, x + i * t.x_stride + 4 * g, 4);
      const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) acc[i][j] = dpbusd(acc[i][j], xb, wv[j]);
    }
  }
  // All sums to memory first, then the epilogue calls: accumulators live across no call
  // (GCC otherwise keeps stack copies of them inside the k loop).
  alignas(64) int32_t sums[MR][NP * kPanel];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const __m512i correction = _mm512_loadu_si512(t.w_correction + (p + j) * kPanel);
      _mm512_store_si512(sums[i] + j * kPanel, _mm512_sub_epi32(acc[i][j], correction));
    }
  }
  for (int i = 0; i < MR; ++i) finish_row(t, i0 + i, p, NP, sums[i]);
}

// block<rows, panels> for run-time rows <= MR and panels <= NP.
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

template <int MR, bool kPrefetch>
void block_rows(int rows, int panels, const Int8Tile& t, int64_t i0, int64_t p) {
  if constexpr (MR == 1) {
    block_panels<1, kBlockPanels, kPrefetch>(panels, t, i0, p);
  } else {
    if (rows == MR) {
      block_panels<MR, kBlockPanels, kPrefetch>(panels, t, i0, p);
    } else {
      block_rows<MR - 1, kPrefetch>(rows, panels, t, i0, p);
    }
  }
}

// One loop nest for every m: x in row blocks of ~256 KiB (L2), weights in groups of 4
// panels, 6-row register steps. The first row step of a group streams its weights from
// memory, prefetching a fixed distance ahead along each panel; later steps (m > 6) find
// the group in L1/L2. With m <= 6 (decode, experts with few tokens) that is a GEMV: all
// rows in registers, each weight byte read once. An L2-prefetching GEMM path (the next
// group prefetched during the row steps, as the bf16 kernel does) was slower at every m
// measured (docs/kernels.md), so there is no separate path.
void matmul_int8(const Int8Tile& t) {
  const int64_t row_block = rows_per_block(t.m, t.x_stride, kRowBlockBytes, kGemmRows);
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    for (int64_t p = t.panel_begin; p < t.panel_end; p += kBlockPanels) {
      const int panels = static_cast<int>(min_of<int64_t>(kBlockPanels, t.panel_end - p));
      for (int64_t i = i0; i < i1; i += kGemmRows) {
        const int rows = static_cast<int>(min_of<int64_t>(kGemmRows, i1 - i));
        if (i == i0) {
          block_rows<kGemmRows, true>(rows, panels, t, i, p);
        } else {
          block_rows<kGemmRows, false>(rows, panels, t, i, p);
        }
      }
    }
  }
}

float quantize_row_int8(const float* x, int64_t k, int64_t k_padded, uint8_t offset, uint8_t* out) {
  // max |x| as the max of the sign-cleared bit patterns, as the scalar reference: inf/NaN
  // patterns are the largest, so a non-finite value is seen.
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i vmax = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    vmax = _mm512_max_epu32(_mm512_and_si512(_mm512_loadu_si512(x + p), abs_mask), vmax);
  }
  if (p < k) {
    vmax = _mm512_max_epu32(
        _mm512_and_si512(_mm512_maskz_loadu_epi32(first_lanes(k - p), x + p), abs_mask), vmax);
  }
  const uint32_t max_bits = _mm512_reduce_max_epu32(vmax);
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
  const __m512 inv = _mm512_set1_ps(inverse);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i off = _mm512_set1_epi32(offset);
  auto quantize = [&](__m512 v) {
    // Round to nearest even (MXCSR default); the clamp only keeps the rounding's edge in range.
    const __m512i q =
        _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), lo), hi);
    return _mm512_add_epi32(q, off);
  };
  for (p = 0; p + 16 <= k; p += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + p),
                     _mm512_cvtepi32_epi8(quantize(_mm512_loadu_ps(x + p))));
  }
  if (p < k) {
    const __mmask16 mask = first_lanes(k - p);
    _mm512_mask_cvtepi32_storeu_epi8(out + p, mask, quantize(_mm512_maskz_loadu_ps(mask, x + p)));
  }
  for (p = k; p < k_padded; ++p) out[p] = offset;
  return absmax / 127.0f;
}

KernelTable make_avx512_vnni_table() {
  KernelTable t = avx512_kernel_table();
  t.level = IsaLevel::kAvx512Vnni;
  t.matmul_int8 = &matmul_int8;
  t.quantize_row_int8 = &quantize_row_int8;
  t.int8_activation_offset = 128;
  return t;
}

}  // namespace

const KernelTable& avx512_vnni_kernel_table() {
  static const KernelTable table = make_avx512_vnni_table();
  return table;
}

}  // namespace peerserve::kernels::internal
