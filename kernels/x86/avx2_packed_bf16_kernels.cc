// AVX2 + FMA kernel for the packed bf16 products (kernels/matmul_packed_bf16.h), used by the
// avx2 and avx512 tables (CPUs without vdpbf16ps). Compiled with -mavx2 -mfma; see
// internal/kernel_table.h for why nothing here calls inline code from other headers.
//
// Outer-product form over the layout of kernels/bf16_matrix.h: a 64-byte k-pair line of a
// panel is two ymm loads (columns 0-7 and 8-15, each lane a (k, k + 1) pair of bf16); a shift
// and a mask widen each into the fp32 weights of k and of k + 1. Activations are widened to
// fp32 once per call and broadcast from memory. Per lane: acc += x_k w_k, then
// acc += x_k+1 w_k+1, k in order: the scalar kernel's sequence, and since a product of two
// bf16 is exact in fp32 unless it falls below 2^-126 (subnormal: then the separate multiply
// rounds it), a fused multiply-add rounds as its separate add does, so the results are
// bitwise the scalar reference's for every product in fp32's normal range.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/internal/kernel_table.h"
#include "kernels/internal/thread_scratch.h"
#include "kernels/x86/row_blocks.h"

namespace peerserve::kernels::internal {
namespace {

constexpr int64_t kPanel = 16;
// Register block: 4 rows x 16 columns = 8 accumulators, 4 widened weight vectors, 2
// broadcast activations (14 of the 16 ymm registers).
constexpr int kRows = 4;
// GEMV block: 1 row x 4 panels = 8 accumulators (8 independent FMA chains).
constexpr int kGemvPanels = 4;
// x rows (fp32) kept in L2 while a panel is reused from L1/L2 by the row steps.
constexpr int64_t kRowBlockBytes = 256 * 1024;
// Prefetch distance along the panel's weight stream, in 64-byte k pairs (into L2).
constexpr int64_t kPrefetchPairs = 16;

template <typename T>
constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

__m256i first_lanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), index);
}

void store_half(float* y, __m256 v, int64_t count, bool accumulate) {
  if (count >= 8) {
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y), v);
    _mm256_storeu_ps(y, v);
  } else if (count > 0) {
    const __m256i mask = first_lanes(count);
    if (accumulate) v = _mm256_add_ps(_mm256_maskload_ps(y, mask), v);
    _mm256_maskstore_ps(y, mask, v);
  }
}

// Rows [i0, i0 + MR) x panels [p, p + NP), all of k; x holds the rows widened to fp32
// (stride xs).
template <int MR, int NP, bool kPrefetch>
void block(const PackedBf16Tile& t, const float* x, int64_t xs, int64_t i0, int64_t p) {
  __m256 acc[MR][NP][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  }
  const uint16_t* w = t.w + p * t.panel_stride;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t g = 0; g < t.k_pairs; ++g) {
    if constexpr (NP == 1) {
      // Rows step: both halves widened once, each row's two activations broadcast once.
      const uint16_t* src = w + 2 * kPanel * g;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(src + 2 * kPanel * kPrefetchPairs), _MM_HINT_T1);
      }
      const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + kPanel));
      const __m256 w0e = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      const __m256 w0o = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
      const __m256 w1e = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
      const __m256 w1o = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const float* xr = x + (i0 + i) * xs + 2 * g;
        const __m256 xe = _mm256_broadcast_ss(xr);
        acc[i][0][0] = _mm256_fmadd_ps(xe, w0e, acc[i][0][0]);
        acc[i][0][1] = _mm256_fmadd_ps(xe, w1e, acc[i][0][1]);
        const __m256 xo = _mm256_broadcast_ss(xr + 1);
        acc[i][0][0] = _mm256_fmadd_ps(xo, w0o, acc[i][0][0]);
        acc[i][0][1] = _mm256_fmadd_ps(xo, w1o, acc[i][0][1]);
      }
    } else {
      // Few rows, several panels: each half widened and used at once (registers for the
      // 2 * MR * NP accumulators).
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
        const uint16_t* src = w + j * t.panel_stride + 2 * kPanel * g;
        if constexpr (kPrefetch) {
          _mm_prefetch(reinterpret_cast<const char*>(src + 2 * kPanel * kPrefetchPairs),
                       _MM_HINT_T1);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + h * kPanel));
          const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
          const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            const float* xr = x + (i0 + i) * xs + 2 * g;
            acc[i][j][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr), we, acc[i][j][h]);
            acc[i][j][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr + 1), wo, acc[i][j][h]);
          }
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      const int64_t c = (p + j) * kPanel;
      float* y = t.y + (i0 + i) * t.y_stride + c;
      store_half(y, acc[i][j][0], t.n - c, t.accumulate);
      store_half(y + 8, acc[i][j][1], t.n - c - 8, t.accumulate);
    }
  }
}

template <int MR, bool kPrefetch>
void block_rows(int rows, const PackedBf16Tile& t, const float* x, int64_t xs, int64_t i0,
                int64_t p) {
  if constexpr (MR == 1) {
    block<1, 1, kPrefetch>(t, x, xs, i0, p);
  } else {
    if (rows == MR) {
      block<MR, 1, kPrefetch>(t, x, xs, i0, p);
    } else {
      block_rows<MR - 1, kPrefetch>(rows, t, x, xs, i0, p);
    }
  }
}

}  // namespace

void avx2_matmul_packed_bf16(const PackedBf16Tile& t) {
  // The activations widened once (bf16 bits are the high half of the fp32 value).
  const int64_t xs = 2 * t.k_pairs;
  float* const widened = thread_scratch_floats(static_cast<size_t>(t.m * xs));
  for (int64_t i = 0; i < t.m; ++i) {
    const uint16_t* src = t.x + i * t.x_stride;
    float* dst = widened + i * xs;
    for (int64_t q = 0; q < xs; ++q) {
      const uint32_t bits = static_cast<uint32_t>(src[q]) << 16;
      std::memcpy(dst + q, &bits, 4);
    }
  }
  const float* x = widened;
  if (t.m == 1) {
    // GEMV: 4 panels per block, so that 8 independent chains hide the FMA latency.
    int64_t p = t.panel_begin;
    for (; p + kGemvPanels <= t.panel_end; p += kGemvPanels)
      block<1, kGemvPanels, true>(t, x, xs, 0, p);
    for (; p < t.panel_end; ++p) block<1, 1, true>(t, x, xs, 0, p);
    return;
  }
  if (t.m < kRows) {
    // 2 or 3 rows: 2 panels per block (8 or 12 chains).
    int64_t p = t.panel_begin;
    for (; p + 2 <= t.panel_end; p += 2) {
      if (t.m == 2) {
        block<2, 2, true>(t, x, xs, 0, p);
      } else {
        block<3, 2, true>(t, x, xs, 0, p);
      }
    }
    for (; p < t.panel_end; ++p) block_rows<kRows, true>(static_cast<int>(t.m), t, x, xs, 0, p);
    return;
  }
  const int64_t row_block = rows_per_block(t.m, xs * 4, kRowBlockBytes, kRows);
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    for (int64_t p = t.panel_begin; p < t.panel_end; ++p) {
      for (int64_t i = i0; i < i1; i += kRows) {
        const int rows = static_cast<int>(min_of<int64_t>(kRows, i1 - i));
        if (i == i0) {
          block_rows<kRows, true>(rows, t, x, xs, i, p);
        } else {
          block_rows<kRows, false>(rows, t, x, xs, i, p);
        }
      }
    }
  }
}

}  // namespace peerserve::kernels::internal
