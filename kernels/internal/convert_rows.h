// Prepares the activation rows of a product (bf16 rounding, int8 quantization) on the
// pool's threads when there are enough of them to pay for the hand-off.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace peerserve::kernels::internal {

// Calls convert(i) for every row i < rows (each row_elements long), in parallel when large.
template <typename Fn>
void convert_rows(int64_t rows, int64_t row_elements, ThreadPool* pool, const Fn& convert) {
  if (pool == nullptr || pool->num_threads() == 1 || rows * row_elements < 64 * 1024) {
    for (int64_t i = 0; i < rows; ++i) convert(i);
    return;
  }
  pool->parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) convert(i);
  });
}

}  // namespace peerserve::kernels::internal
