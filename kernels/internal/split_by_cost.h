// Splits the work of several products over a pool's threads in proportion to cost, cut at
// whole units (panels), for the packed-weight products (matmul_int8.cc,
// matmul_packed_bf16.cc). Which thread computes a unit never changes its result: each
// output is summed in one fixed order whatever range it falls in.
#pragma once

#include <algorithm>
#include <cstdint>

#include "base/thread_pool.h"

namespace peerserve::kernels::internal {

// Work item i has units(i) units costing cost_per_unit(i) each (> 0). Thread t of nt takes
// the cost range [total * t / nt, total * (t + 1) / nt) of the items laid end to end, cut at
// the nearest unit boundary (adjacent threads round at the same offsets, so their ranges tile
// every item exactly), and calls run(i, unit_begin, unit_end) for each non-empty piece. Below
// `serial_work` in total, or without a pool, the calling thread runs every item whole.
template <typename Units, typename CostPerUnit, typename Run>
void split_by_cost(ThreadPool* pool, int64_t items, int64_t serial_work, const Units& units,
                   const CostPerUnit& cost_per_unit, const Run& run) {
  int64_t total = 0;
  for (int64_t i = 0; i < items; ++i) total += units(i) * cost_per_unit(i);
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  if (threads == 1 || total < serial_work) {
    for (int64_t i = 0; i < items; ++i) run(i, int64_t{0}, units(i));
    return;
  }
  pool->run_on_all([&](int t, int nt) {
    const int64_t lo = total * t / nt, hi = total * (t + 1) / nt;
    int64_t start = 0;
    for (int64_t i = 0; i < items; ++i) {
      const int64_t n = units(i), cost = cost_per_unit(i), span = n * cost;
      const int64_t a = std::max(lo, start) - start, b = std::min(hi, start + span) - start;
      start += span;
      if (a >= b) continue;
      auto unit_at = [&](int64_t offset) { return std::min(n, (offset + cost / 2) / cost); };
      const int64_t u0 = unit_at(a), u1 = b == span ? n : unit_at(b);
      if (u0 < u1) run(i, u0, u1);
    }
  });
}

}  // namespace peerserve::kernels::internal
