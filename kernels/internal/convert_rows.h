// Prepares the activation rows of a product (bf16 rounding, int8 quantization) on the
// pool's threads when there are enough of them to pay for the hand-off.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

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

// The rows of several problems as one pass: problem g owns global rows [first_row[g],
// first_row[g + 1]); calls convert(g, i) for each of its rows i (local index). One parallel
// pass for all of them, so that many small problems (MoE experts with a few tokens each,
// each below the threshold alone) do not run their conversions serially one after another.
template <typename Fn>
void convert_grouped_rows(std::span<const int64_t> first_row, int64_t total_elements,
                          ThreadPool* pool, const Fn& convert) {
  const int64_t groups = static_cast<int64_t>(first_row.size()) - 1;
  if (groups <= 0) return;
  auto run = [&](int64_t begin, int64_t end) {
    // The group of row `begin`, then walk forward.
    int64_t g = std::upper_bound(first_row.begin(), first_row.end(), begin) - first_row.begin() - 1;
    for (int64_t r = begin; r < end; ++r) {
      while (r >= first_row[g + 1]) ++g;
      convert(g, r - first_row[g]);
    }
  };
  const int64_t rows = first_row[groups];
  if (pool == nullptr || pool->num_threads() == 1 || total_elements < 64 * 1024) {
    run(0, rows);
    return;
  }
  pool->parallel_for(rows, run);
}

}  // namespace peerserve::kernels::internal
