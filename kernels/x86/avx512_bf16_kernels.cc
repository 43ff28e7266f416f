// AVX512_BF16 kernels: the bf16 x bf16 matmul with vdpbf16ps and the fp32 -> bf16 conversion
// with vcvtne2ps2bf16; everything else is the AVX512_VNNI table. Compiled with -mavx512bf16
// (see internal/kernel_table.h).
//
// Summation order of y[i, j] (the same in every register block: batch invariance): one
// 16-lane fp32 accumulator; each k step of 32 adds lane l's pair x[2l, 2l+1] * w[2l, 2l+1]
// (vdpbf16ps, one instruction per step); the k tail is zero-padded (x by the caller's
// packing, w by a masked load); then the canonical lane reduction (reduce_add).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/avx512_math.h"
#include "kernels/x86/row_blocks.h"
#include "kernels/x86/weight_prefetch.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kStep = 32;  // bf16 elements per vdpbf16ps
// x rows (bf16) kept in L2 while a block of weight rows streams through L1.
constexpr int64_t kRowBlockBytes = 256 * 1024;

template <typename T>
constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

inline __m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh>(v);
}

// `next`: with MR == 1, the weight rows to prefetch alongside (prefetch_next_rows), or null.
template <int MR, int NR>
inline void dp_block(const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride,
                     int64_t k, float* y, int64_t y_stride, bool accumulate,
                     const uint16_t* next = nullptr) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  int64_t p = 0;
  for (; p + kStep <= k; p += kStep) {
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_si512(w + j * w_stride + p);
    if constexpr (MR == 1) prefetch_next_rows<NR>(next, w_stride, p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_loadu_si512(x + i * x_stride + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], as_bh(xv), as_bh(wv[j]));
    }
  }
  if (p < k) {
    const __mmask32 mask = static_cast<__mmask32>((1ull << (k - p)) - 1u);
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_epi16(mask, w + j * w_stride + p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_loadu_si512(x + i * x_stride + p);  // zero-padded by the caller
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], as_bh(xv), as_bh(wv[j]));
    }
  }
  store_block_sums<MR, NR>(acc, y, y_stride, accumulate);
}

template <int MR, int NR, int R = MR>
inline void dp_rows(int rows, const uint16_t* x, int64_t x_stride, const uint16_t* w,
                    int64_t w_stride, int64_t k, float* y, int64_t y_stride, bool accumulate) {
  if constexpr (R == 1) {
    dp_block<1, NR>(x, x_stride, w, w_stride, k, y, y_stride, accumulate);
  } else {
    if (rows == R) {
      dp_block<R, NR>(x, x_stride, w, w_stride, k, y, y_stride, accumulate);
    } else {
      dp_rows<MR, NR, R - 1>(rows, x, x_stride, w, w_stride, k, y, y_stride, accumulate);
    }
  }
}

template <int MR, int NR>
void dp_tile(const MatmulTile& t) {
  const uint16_t* x = static_cast<const uint16_t*>(t.x);
  const uint16_t* w = static_cast<const uint16_t*>(t.w);
  const int64_t row_block = rows_per_block(t.m, t.x_stride * 2, kRowBlockBytes, MR);
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    int64_t j = t.n_begin;
    if constexpr (MR == 1) {
      for (; j + NR <= t.n_end; j += NR) {
        dp_block<1, NR>(x + i0 * t.x_stride, t.x_stride, w + j * t.w_stride, t.w_stride, t.k,
                        t.y + i0 * t.y_stride + j, t.y_stride, t.accumulate,
                        next_gemv_block<NR>(w, t.w_stride, j, t.n_end));
      }
    }
    WeightPrefetch prefetch(w, t.w_stride, t.k, NR, (i1 - i0 + MR - 1) / MR);
    for (; j + NR <= t.n_end; j += NR) {
      prefetch.start_block(j + NR, j + 2 * NR <= t.n_end);
      for (int64_t i = i0; i < i1; i += MR) {
        prefetch.step();
        dp_rows<MR, NR>(static_cast<int>(min_of<int64_t>(MR, i1 - i)), x + i * t.x_stride,
                        t.x_stride, w + j * t.w_stride, t.w_stride, t.k, t.y + i * t.y_stride + j,
                        t.y_stride, t.accumulate);
      }
    }
    for (; j < t.n_end; ++j) {
      for (int64_t i = i0; i < i1; i += MR) {
        dp_rows<MR, 1>(static_cast<int>(min_of<int64_t>(MR, i1 - i)), x + i * t.x_stride,
                       t.x_stride, w + j * t.w_stride, t.w_stride, t.k, t.y + i * t.y_stride + j,
                       t.y_stride, t.accumulate);
      }
    }
  }
}

void matmul_bf16_bf16(const MatmulTile& t) {
  if (t.m == 1) {
    dp_tile<1, 8>(t);
  } else if (t.m == 2) {
    dp_tile<2, 8>(t);
  } else {
    // 5 x 5: 25 accumulators, 10 loads per 25 vdpbf16ps; measured ahead of 4 x 6, 6 x 4 and
    // 8 x 3 on 512-row GEMMs (docs/kernels.md).
    dp_tile<5, 5>(t);
  }
}

// ---- Packed weights (kernels/bf16_matrix.h): outer-product form ----
//
// One zmm accumulator holds 16 output columns; each k pair adds, per lane, the row's two
// activations (broadcast) times the column's two weights (vdpbf16ps). Per lane the pairs are
// summed in k order in every block shape, so block shapes, row steps and thread splits give
// the same bits.

constexpr int64_t kPanel = 16;
// GEMM register block: 6 rows x 4 panels (64 columns) = 24 accumulators, per k pair 4
// weight loads + 6 broadcasts for 24 vdpbf16ps.
constexpr int kPackedRows = 6;
constexpr int kPackedPanels = 4;
// Prefetch distance along each panel's weight stream, in 64-byte k pairs (into L2, as the
// INT8 kernel does).
constexpr int64_t kPackedPrefetchPairs = 16;
// Decode register block (7 to 16 rows): 8 rows x 3 panels, also 24 accumulators.
constexpr int kDecodeRows = 8;
constexpr int kDecodePanels = 3;

// acc += vdpbf16ps(x, w). Inline asm for the reason the INT8 kernel gives: GCC 12 keeps
// stack copies of intrinsic accumulators in a 24-accumulator loop.
inline __m512 dpbf16(__m512 acc, __m512i x, __m512i w) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  return acc;
}

// Rows [i0, i0 + MR) x panels [p, p + NP), all of k.
template <int MR, int NP, bool kPrefetch>
void packed_block(const PackedBf16Tile& t, int64_t i0, int64_t p) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const uint16_t* w = t.w + p * t.panel_stride;
  const uint16_t* x = t.x + i0 * t.x_stride;
  for (int64_t g = 0; g < t.k_pairs; ++g) {
    __m512i wv[NP];
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const uint16_t* src = w + j * t.panel_stride + 2 * kPanel * g;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(src + 2 * kPanel * kPackedPrefetchPairs),
                     _MM_HINT_T1);
      }
      wv[j] = _mm512_load_si512(src);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, x + i * t.x_stride + 2 * g, 4);
      const __m512i xb = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) acc[i][j] = dpbf16(acc[i][j], xb, wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* y = t.y + (i0 + i) * t.y_stride;
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const int64_t c = (p + j) * kPanel, count = t.n - c;
      if (count <= 0) break;
      const __mmask16 mask =
          count >= kPanel ? __mmask16{0xffff} : static_cast<__mmask16>((1u << count) - 1u);
      __m512 v = acc[i][j];
      if (t.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y + c), v);
      _mm512_mask_storeu_ps(y + c, mask, v);
    }
  }
}

template <int MR, int NP, bool kPrefetch>
void packed_block_panels(int panels, const PackedBf16Tile& t, int64_t i0, int64_t p) {
  if constexpr (NP == 1) {
    packed_block<MR, 1, kPrefetch>(t, i0, p);
  } else {
    if (panels == NP) {
      packed_block<MR, NP, kPrefetch>(t, i0, p);
    } else {
      packed_block_panels<MR, NP - 1, kPrefetch>(panels, t, i0, p);
    }
  }
}

template <int MR, int NP, bool kPrefetch>
void packed_block_rows(int rows, int panels, const PackedBf16Tile& t, int64_t i0, int64_t p) {
  if constexpr (MR == 1) {
    packed_block_panels<1, NP, kPrefetch>(panels, t, i0, p);
  } else {
    if (rows == MR) {
      packed_block_panels<MR, NP, kPrefetch>(panels, t, i0, p);
    } else {
      packed_block_rows<MR - 1, NP, kPrefetch>(rows, panels, t, i0, p);
    }
  }
}

// x in row blocks of ~256 KiB (L2), weights in groups of NP panels, MR-row register steps;
// the first row step of a group streams its weights from memory (prefetching ahead along
// each panel), later ones find them in L1/L2.
template <int MR, int NP>
void packed_loop(const PackedBf16Tile& t) {
  const int64_t row_block = rows_per_block(t.m, t.x_stride * 2, kRowBlockBytes, MR);
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    for (int64_t p = t.panel_begin; p < t.panel_end; p += NP) {
      const int panels = static_cast<int>(min_of<int64_t>(NP, t.panel_end - p));
      for (int64_t i = i0; i < i1; i += MR) {
        const int rows = static_cast<int>(min_of<int64_t>(MR, i1 - i));
        if (i == i0) {
          packed_block_rows<MR, NP, true>(rows, panels, t, i, p);
        } else {
          packed_block_rows<MR, NP, false>(rows, panels, t, i, p);
        }
      }
    }
  }
}

// 6 x 4 blocks for every m, except 7 to 16 rows (a decode batch of that size): 8 x 3 blocks,
// so that 16 rows take two passes over a weight group (one from memory, one from L2)
// instead of three (6 + 6 + 4). Measured (peerserve_bench_kernels --packed-bf16, same
// binary, interleaved): 16 x 2048 x 2048 0.242 -> 0.223 ms; v2-lite 4 layers batch-16 decode
// 79.5 -> 78.4-79.2 ms. 16 rows x 1 panel (one pass) was 2.2x slower: the 16 activation
// rows were re-read from L2 for every panel, as many bytes as the weights.
void matmul_packed_bf16(const PackedBf16Tile& t) {
  if (t.m > kPackedRows && t.m <= 2 * kDecodeRows) {
    packed_loop<kDecodeRows, kDecodePanels>(t);
  } else {
    packed_loop<kPackedRows, kPackedPanels>(t);
  }
}

// fp32 -> bf16 bits, rounded to nearest even, NaNs quieted: what vcvtne2ps2bf16 does, except
// that it flushes subnormal inputs to zero. A vector holding a subnormal (rare: below 1.2e-38)
// takes the integer rounding of the AVX-512 table instead, so every level converts alike.
// The test is one vfpclassps (class 0x20: denormal, either sign) per vector. The integer test
// it replaced (and, subtract, compare) made converting 768 rows of 1,024 into 1.5 MB 14%
// slower (24.1 against 21.1 us, one thread, one process); the expert-parallel combine, which
// converts as much into another process's window, did not move beyond its noise.
inline __mmask16 subnormal_lanes(__m512 v) {
  return _mm512_fpclass_ps_mask(v, 0x20);
}

inline __m256i integer_rounded_bf16(__m512i u) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_bits(u), 16));
}

inline __m256i bf16_of(__m512 v) {
  if (subnormal_lanes(v) != 0) [[unlikely]]
    return integer_rounded_bf16(_mm512_castps_si512(v));
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
    if ((subnormal_lanes(lo) | subnormal_lanes(hi)) == 0) [[likely]] {
      _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_of(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), bf16_of(hi));
    }
  }
  for (; i < n; i += 16) {
    const int rest = static_cast<int>(n - i < 16 ? n - i : 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << rest) - 1u);
    _mm256_mask_storeu_epi16(dst + i, mask, bf16_of(_mm512_maskz_loadu_ps(mask, src + i)));
  }
}

KernelTable make_avx512_bf16_table() {
  KernelTable t = avx512_vnni_kernel_table();
  t.level = IsaLevel::kAvx512Bf16;
  t.matmul_bf16_bf16 = &matmul_bf16_bf16;
  t.bf16_x_k_multiple = kStep;
  t.matmul_packed_bf16 = &matmul_packed_bf16;
  t.packed_bf16_fast = true;
  t.fp32_to_bf16 = &fp32_to_bf16;
  return t;
}

}  // namespace

const KernelTable& avx512_bf16_kernel_table() {
  static const KernelTable table = make_avx512_bf16_table();
  return table;
}

}  // namespace peerserve::kernels::internal
