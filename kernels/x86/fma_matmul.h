// The fp32 multiply-add matmul shared by the AVX2 and AVX-512 files, written once over a
// vector-operations policy V. Included only by files compiled for that ISA; everything here
// has internal linkage (anonymous namespace) so that each ISA keeps its own copy.
//
// Summation order of y[i, j] (the same in every register block, which makes the kernels
// batch-invariant): an accumulator of V::kLanes fp32 lanes, lane l summing
// x[i, p] * w[j, p] for p = l, l + L, l + 2L, ... with one fused multiply-add each (the
// k tail is zero-padded), then the lanes reduced by V::reduce_many: each sum in a fixed halving
// tree.
//
// Register block MR x NR: NR weight vectors are loaded (and widened) once per k step and
// reused for MR rows of x. x rows are blocked by about kRowBlockBytes so that they stay in
// L2 while the weight block streams through L1.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/internal/kernel_table.h"
#include "kernels/x86/row_blocks.h"
#include "kernels/x86/weight_prefetch.h"

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

constexpr int64_t kRowBlockBytes = 256 * 1024;

template <typename T>
constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

// `next`: with MR == 1, the weight rows to prefetch alongside (prefetch_next_rows), or null.
template <typename V, int MR, int NR, typename XT, typename WT>
inline void fma_block(const XT* x, int64_t x_stride, const WT* w, int64_t w_stride, int64_t k,
                      float* y, int64_t y_stride, bool accumulate, const WT* next = nullptr) {
  using Reg = typename V::Reg;
  constexpr int64_t L = V::kLanes;
  Reg acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
  }
  int64_t p = 0;
  for (; p + L <= k; p += L) {
    Reg wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = V::load_w(w + j * w_stride + p);
    if constexpr (MR == 1) prefetch_next_rows<NR>(next, w_stride, p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const Reg xv = V::load_x(x + i * x_stride + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  if (p < k) {
    const int rest = static_cast<int>(k - p);
    Reg wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = V::load_w_part(w + j * w_stride + p, rest);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const Reg xv = V::load_x_part(x + i * x_stride + p, rest);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  V::template store_sums<MR, NR>(acc, y, y_stride, accumulate);
}

// Rows [i, i + rows) (rows <= MR) against columns [j, j + NR).
template <typename V, int MR, int NR, int R = MR, typename XT, typename WT>
inline void fma_rows(int rows, const XT* x, int64_t x_stride, const WT* w, int64_t w_stride,
                     int64_t k, float* y, int64_t y_stride, bool accumulate) {
  if constexpr (R == 1) {
    fma_block<V, 1, NR>(x, x_stride, w, w_stride, k, y, y_stride, accumulate);
  } else {
    if (rows == R) {
      fma_block<V, R, NR>(x, x_stride, w, w_stride, k, y, y_stride, accumulate);
    } else {
      fma_rows<V, MR, NR, R - 1>(rows, x, x_stride, w, w_stride, k, y, y_stride, accumulate);
    }
  }
}

// The tile entry: MR x NR register blocks over rows [0, m) and columns [n_begin, n_end).
template <typename V, int MR, int NR, typename XT, typename WT>
void fma_tile(const MatmulTile& t) {
  const XT* x = static_cast<const XT*>(t.x);
  const WT* w = static_cast<const WT*>(t.w);
  const int64_t row_block = rows_per_block(t.m, t.k * int64_t{sizeof(XT)}, kRowBlockBytes, MR);
  for (int64_t i0 = 0; i0 < t.m; i0 += row_block) {
    const int64_t i1 = min_of(t.m, i0 + row_block);
    int64_t j = t.n_begin;
    if constexpr (MR == 1) {
      for (; j + NR <= t.n_end; j += NR) {
        fma_block<V, 1, NR>(x + i0 * t.x_stride, t.x_stride, w + j * t.w_stride, t.w_stride, t.k,
                            t.y + i0 * t.y_stride + j, t.y_stride, t.accumulate,
                            next_gemv_block<NR>(w, t.w_stride, j, t.n_end));
      }
    }
    WeightPrefetch prefetch(w, t.w_stride, t.k, NR, (i1 - i0 + MR - 1) / MR);
    for (; j + NR <= t.n_end; j += NR) {
      prefetch.start_block(j + NR, j + 2 * NR <= t.n_end);
      for (int64_t i = i0; i < i1; i += MR) {
        prefetch.step();
        fma_rows<V, MR, NR>(static_cast<int>(min_of<int64_t>(MR, i1 - i)), x + i * t.x_stride,
                            t.x_stride, w + j * t.w_stride, t.w_stride, t.k,
                            t.y + i * t.y_stride + j, t.y_stride, t.accumulate);
      }
    }
    // The column tail in blocks of 4, 2, then 1 columns: one column at a time does MR
    // multiply-adds per MR + 1 loads, and the 4-column tail of the absorbed attention's
    // 16-key cache blocks took 40% of its score products' samples (docs/kernels.md). Every
    // block shape sums an element in the same order (see above), so the bits do not change.
    auto tail = [&]<int kColumns>(std::integral_constant<int, kColumns>) {
      for (; j + kColumns <= t.n_end; j += kColumns) {
        for (int64_t i = i0; i < i1; i += MR) {
          fma_rows<V, MR, kColumns>(static_cast<int>(min_of<int64_t>(MR, i1 - i)),
                                    x + i * t.x_stride, t.x_stride, w + j * t.w_stride, t.w_stride,
                                    t.k, t.y + i * t.y_stride + j, t.y_stride, t.accumulate);
        }
      }
    };
    if constexpr (NR > 4) tail(std::integral_constant<int, 4>{});
    if constexpr (NR > 2) tail(std::integral_constant<int, 2>{});
    tail(std::integral_constant<int, 1>{});
  }
}

}  // namespace
}  // namespace peerserve::kernels::internal
