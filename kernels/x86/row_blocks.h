// The row blocks of the x86 tile loops: x rows are taken in blocks of about a budget of
// bytes (kept in L2 while a group of weights streams through L1). Internal linkage on
// purpose (see internal/kernel_table.h).
#pragma once

#include <cstdint>

namespace peerserve::kernels::internal {
namespace {  // NOLINT: internal linkage per ISA translation unit, on purpose

// Rows per block: budget_bytes / row_bytes rounded up to whole register steps of `step`
// rows, at least one step, at most m (when m >= 1). A row wider than the whole budget
// still gets a block of one step: zero rows would never advance the loop over blocks.
constexpr int64_t rows_per_block(int64_t m, int64_t row_bytes, int64_t budget_bytes, int64_t step) {
  int64_t rows = row_bytes > 0 ? budget_bytes / row_bytes : m;
  if (rows < 1) rows = 1;
  rows = (rows + step - 1) / step * step;
  return rows < m ? rows : (m > 0 ? m : 1);
}

static_assert(rows_per_block(100, 1 << 20, 256 * 1024, 6) == 6);
static_assert(rows_per_block(100, 1024, 256 * 1024, 6) == 100);
static_assert(rows_per_block(1000, 1024, 256 * 1024, 6) == 258);
static_assert(rows_per_block(3, 1 << 20, 256 * 1024, 6) == 3);

}  // namespace
}  // namespace peerserve::kernels::internal
