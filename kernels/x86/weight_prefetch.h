// Software prefetch of the next block of weight rows into L2 while the current block is
// multiplied with every row of the activation block: the first pass over a weight block
// would otherwise wait on L3 or memory. The block's cache lines are spread evenly over the
// row steps. Internal linkage on purpose (see internal/kernel_table.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

template <typename WT>
class WeightPrefetch {
 public:
  // Blocks of `block_rows` rows of `k` elements; `row_steps` calls to step() per block.
  WeightPrefetch(const WT* w, int64_t w_stride, int64_t k, int64_t block_rows, int64_t row_steps)
      : w_(reinterpret_cast<const char*>(w)),
        w_stride_bytes_(w_stride * int64_t{sizeof(WT)}),
        block_rows_(block_rows),
        lines_per_row_((k * int64_t{sizeof(WT)} + 63) / 64),
        per_step_((block_rows * lines_per_row_ + row_steps - 1) / row_steps) {}

  // The block starting at weight row `first_row` is next; `enabled` false past the end.
  void start_block(int64_t first_row, bool enabled) {
    row_ = enabled ? w_ + first_row * w_stride_bytes_ : nullptr;
    rows_left_ = block_rows_;
    line_ = 0;
  }

  // The next per_step_ lines, row by row (counters, not a division per line: measured).
  void step() {
    if (row_ == nullptr) return;
    for (int64_t l = 0; l < per_step_; ++l) {
      _mm_prefetch(row_ + line_ * 64, _MM_HINT_T1);
      if (++line_ == lines_per_row_) {
        line_ = 0;
        row_ += w_stride_bytes_;
        if (--rows_left_ == 0) {
          row_ = nullptr;
          return;
        }
      }
    }
  }

 private:
  const char* w_;
  int64_t w_stride_bytes_;
  int64_t block_rows_;
  int64_t lines_per_row_;
  int64_t per_step_;
  const char* row_ = nullptr;  // the row being prefetched; null when done or disabled
  int64_t rows_left_ = 0;
  int64_t line_ = 0;
};

// GEMV (one activation row): each weight byte is used once, so the block of rows after the
// current one is prefetched into L2 from inside the current block's k loop — each k step
// prefetches the same offset of the next block's rows — rather than in one burst at the
// block's start, as WeightPrefetch does for several rows (a burst of a whole block's lines
// overflows the core's outstanding-miss slots). On AVX2 a step covers less than a line; the
// repeated prefetches of a line cost little next to the misses they hide. Measured in
// docs/kernels.md ("GEMV prefetch"). `next` is that block's first row, or null.
template <int NR, typename WT>
inline void prefetch_next_rows(const WT* next, int64_t w_stride, int64_t p) {
  if (next == nullptr) return;
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(next + j * w_stride + p), _MM_HINT_T1);
  }
}

// The first row of the block after rows [j, j + NR), or null when that block is not whole
// inside [.., n_end) (a GEMV tile's last block prefetches nothing).
template <int NR, typename WT>
inline const WT* next_gemv_block(const WT* w, int64_t w_stride, int64_t j, int64_t n_end) {
  return j + 2 * NR <= n_end ? w + (j + NR) * w_stride : nullptr;
}

}  // namespace
}  // namespace peerserve::kernels::internal
