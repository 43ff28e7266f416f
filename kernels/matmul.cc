// matmul_bf16 / matmul_f32 / grouped_matmul_bf16: argument checks, activation preparation
// (bf16 rounding or packing), and the split of the work over threads. The arithmetic is in
// the per-ISA tile functions (internal/kernel_table.h); every tile function computes each
// output element in the same order whatever block it is in, which is what makes the split
// invisible in the results (batch invariance).
#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/internal/convert_rows.h"
#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels {
namespace {

using internal::convert_rows;
using internal::KernelTable;
using internal::MatmulTile;
using internal::MatmulTileFn;

// Thread boundaries fall on multiples of this many columns, so that the tile functions run
// whole register blocks (any multiple of their column block would do; results do not
// depend on it).
constexpr int64_t kColumnGranule = 16;
// Below this much work (multiply-adds + weight elements) one thread does it all: waking
// the pool would cost more than it saves.
constexpr int64_t kSerialWork = 16 * 1024;
// A weight row costs about as much to stream from memory as this many rows of x cost to
// multiply with it once it is in cache (used only to balance threads).
constexpr int64_t kWeightRowCost = 8;

struct Task {
  MatmulTile tile;  // n_begin = 0, n_end = n
  MatmulTileFn fn = nullptr;
  int64_t cost_per_column = 0;
};

// Scratch for converted activations, reused across calls on the same thread.
template <typename T>
T* scratch(size_t elements) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < elements) buffer.resize(elements);
  return buffer.data();
}

template <typename Weight>
MatmulArgs<Weight> checked(const MatmulArgs<Weight>& a, const char* what) {
  MatmulArgs<Weight> r = a;
  PS_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0)
      << what << ": negative shape m=" << a.m << " n=" << a.n << " k=" << a.k;
  if (r.x_stride == 0) r.x_stride = a.k;
  if (r.w_stride == 0) r.w_stride = a.k;
  if (r.y_stride == 0) r.y_stride = a.n;
  PS_CHECK(r.x_stride >= a.k && r.w_stride >= a.k && r.y_stride >= a.n)
      << what << ": strides x=" << r.x_stride << " w=" << r.w_stride << " y=" << r.y_stride
      << " too small for m=" << a.m << " n=" << a.n << " k=" << a.k;
  if (a.m > 0 && a.n > 0) {
    PS_CHECK(a.y != nullptr) << what << ": y is null";
    if (a.k > 0) {
      PS_CHECK(a.x != nullptr && a.w != nullptr) << what << ": x or w is null";
    }
  }
  return r;
}

// Handles the degenerate shapes; returns true if nothing is left to compute.
template <typename Weight>
bool trivial(const MatmulArgs<Weight>& a) {
  if (a.m == 0 || a.n == 0) return true;
  if (a.k > 0) return false;
  if (!a.accumulate) {
    for (int64_t i = 0; i < a.m; ++i) std::fill_n(a.y + i * a.y_stride, a.n, 0.0f);
  }
  return true;
}

// The column of problem `task` at cost offset `offset` (0 <= offset <= total cost of the
// task), rounded to the granule. Adjacent threads evaluate it at the same offsets, so their
// column ranges tile [0, n) exactly.
int64_t column_at(const Task& task, int64_t offset) {
  const int64_t n = task.tile.n_end;
  const int64_t column = offset / task.cost_per_column;
  const int64_t rounded = (column + kColumnGranule / 2) / kColumnGranule * kColumnGranule;
  return std::min(rounded, n);
}

void run_tasks(std::span<const Task> tasks, ThreadPool* pool) {
  int64_t total = 0;
  for (const Task& t : tasks) total += t.tile.n_end * t.cost_per_column;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  if (threads == 1 || total < kSerialWork) {
    for (const Task& t : tasks) t.fn(t.tile);
    return;
  }
  // Thread t takes the cost range [total * t / threads, total * (t + 1) / threads) of the
  // tasks laid end to end, cut at column granules.
  pool->run_on_all([&](int t, int nt) {
    const int64_t lo = total * t / nt, hi = total * (t + 1) / nt;
    int64_t start = 0;
    for (const Task& task : tasks) {
      const int64_t span = task.tile.n_end * task.cost_per_column;
      const int64_t a = std::max(lo, start) - start, b = std::min(hi, start + span) - start;
      start += span;
      if (a >= b) continue;
      MatmulTile tile = task.tile;
      tile.n_begin = column_at(task, a);
      tile.n_end = b == span ? tile.n_end : column_at(task, b);
      if (tile.n_begin < tile.n_end) task.fn(tile);
    }
  });
}

template <typename Weight>
Task make_task(const MatmulArgs<Weight>& a, const void* x, int64_t x_stride, MatmulTileFn fn) {
  Task task;
  task.tile.x = x;
  task.tile.x_stride = x_stride;
  task.tile.w = a.w;
  task.tile.w_stride = a.w_stride;
  task.tile.y = a.y;
  task.tile.y_stride = a.y_stride;
  task.tile.m = a.m;
  task.tile.k = a.k;
  task.tile.n_begin = 0;
  task.tile.n_end = a.n;
  task.tile.accumulate = a.accumulate;
  task.fn = fn;
  task.cost_per_column = a.k * (a.m + kWeightRowCost);
  return task;
}

int64_t round_up(int64_t v, int64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

// Row stride (elements) of a packed bf16 activation panel: k padded to the kernel's
// multiple, plus one cache line when rows would otherwise be a multiple of 1 KiB apart, so
// that the rows of a register block do not all fall into the same L1 set (k = 2048 gives
// 4 KiB rows: the 4 x rows and 6 weight rows of a block would compete for 8 ways).
int64_t packed_stride(int64_t k, int64_t multiple) {
  const int64_t padded = round_up(k, multiple);
  return (padded * 2) % 1024 == 0 ? padded + 32 : padded;
}

}  // namespace

void grouped_matmul_bf16(std::span<const MatmulBf16Args> problems, ActivationPrecision precision,
                         ThreadPool* pool) {
  const KernelTable& table = internal::active_kernel_table();
  // Reused per thread: a steady decode step allocates nothing (the expert-parallel path
  // counts allocations).
  thread_local std::vector<MatmulBf16Args> live;
  thread_local std::vector<Task> tasks;
  live.clear();
  tasks.clear();
  for (const MatmulBf16Args& p : problems) {
    MatmulBf16Args a = checked(p, "grouped_matmul_bf16");
    if (!trivial(a)) live.push_back(a);
  }
  if (live.empty()) return;

  if (precision == ActivationPrecision::kFp32) {
    for (const auto& a : live)
      tasks.push_back(make_task(a, a.x, a.x_stride, table.matmul_f32_bf16));
  } else if (table.matmul_bf16_bf16 != nullptr) {
    // Pack x as bf16 rows padded with zeros to the kernel's k multiple.
    size_t elements = 0;
    for (const auto& a : live) {
      elements += static_cast<size_t>(a.m * packed_stride(a.k, table.bf16_x_k_multiple));
    }
    uint16_t* packed = scratch<uint16_t>(elements);
    for (const auto& a : live) {
      const int64_t kp = packed_stride(a.k, table.bf16_x_k_multiple);
      convert_rows(a.m, a.k, pool, [&](int64_t i) {
        table.fp32_to_bf16(a.x + i * a.x_stride, packed + i * kp, a.k);
        std::fill(packed + i * kp + a.k, packed + (i + 1) * kp, uint16_t{0});
      });
      tasks.push_back(make_task(a, packed, kp, table.matmul_bf16_bf16));
      packed += a.m * kp;
    }
  } else {
    // Same products as vdpbf16ps: x rounded to bf16 values, then exact fp32 products.
    size_t elements = 0;
    for (const auto& a : live) elements += static_cast<size_t>(a.m * a.k);
    float* rounded = scratch<float>(elements);
    for (const auto& a : live) {
      convert_rows(a.m, a.k, pool, [&](int64_t i) {
        table.round_to_bf16(a.x + i * a.x_stride, rounded + i * a.k, a.k);
      });
      tasks.push_back(make_task(a, rounded, a.k, table.matmul_f32_bf16));
      rounded += a.m * a.k;
    }
  }
  run_tasks(tasks, pool);
}

void matmul_bf16(const MatmulBf16Args& args, ActivationPrecision precision, ThreadPool* pool) {
  grouped_matmul_bf16(std::span<const MatmulBf16Args>(&args, 1), precision, pool);
}

void matmul_f32(const MatmulF32Args& args, ThreadPool* pool) {
  const MatmulF32Args a = checked(args, "matmul_f32");
  if (trivial(a)) return;
  const Task task = make_task(a, a.x, a.x_stride, internal::active_kernel_table().matmul_f32_f32);
  run_tasks(std::span<const Task>(&task, 1), pool);
}

}  // namespace peerserve::kernels
