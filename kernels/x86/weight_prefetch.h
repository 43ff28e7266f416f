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
      : w_(w),
        w_stride_(w_stride),
        lines_per_row_((k * int64_t{sizeof(WT)} + 63) / 64),
        lines_(block_rows * lines_per_row_),
        per_step_((lines_ + row_steps - 1) / row_steps) {}

  // The block starting at weight row `first_row` is next; `enabled` false past the end.
  void start_block(int64_t first_row, bool enabled) {
    first_row_ = first_row;
    enabled_ = enabled;
    next_line_ = 0;
  }

  void step() {
    if (!enabled_) return;
    const int64_t end = next_line_ + per_step_ < lines_ ? next_line_ + per_step_ : lines_;
    for (int64_t l = next_line_; l < end; ++l) {
      const int64_t row = l / lines_per_row_, line = l % lines_per_row_;
      _mm_prefetch(reinterpret_cast<const char*>(w_ + (first_row_ + row) * w_stride_) + line * 64,
                   _MM_HINT_T1);
    }
    next_line_ = end;
  }

 private:
  const WT* w_;
  int64_t w_stride_;
  int64_t lines_per_row_;
  int64_t lines_;
  int64_t per_step_;
  int64_t first_row_ = 0;
  int64_t next_line_ = 0;
  bool enabled_ = false;
};

}  // namespace
}  // namespace peerserve::kernels::internal
