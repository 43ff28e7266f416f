// matmul_packed_bf16 and its grouped form: argument checks, the bf16 rounding of x and the
// split of panels over threads. The arithmetic is in the per-ISA packed tile functions
// (internal/kernel_table.h).
#include "kernels/matmul_packed_bf16.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "kernels/internal/convert_rows.h"
#include "kernels/internal/kernel_table.h"
#include "kernels/internal/split_by_cost.h"

namespace peerserve::kernels {
namespace {

using internal::KernelTable;
using internal::PackedBf16Tile;

constexpr int64_t kPanel = PackedBf16Matrix::kPanelColumns;
// Below this much work (multiply-adds + weight elements) one thread does it all.
constexpr int64_t kSerialWork = 16 * 1024;
// A weight element costs about as much to stream as this many rows multiplying it in cache
// (used only to balance threads).
constexpr int64_t kWeightCost = 8;

struct Task {
  PackedBf16Tile tile;  // panel_begin = 0, panel_end = all panels
  int64_t cost_per_panel = 0;
};

// Thread-local scratch for the bf16 activations, reused across calls: a steady decode step
// allocates nothing.
uint16_t* scratch(size_t elements) {
  thread_local std::vector<uint16_t> buffer;
  if (buffer.size() < elements) buffer.resize(elements);
  return buffer.data();
}

// Elements between bf16 activation rows: k padded to pairs, plus one cache line when rows
// would be a multiple of 1 KiB apart (the rows of a register block would share L1 sets).
int64_t activation_stride(int64_t k_pairs) {
  const int64_t elements = std::max<int64_t>(32, (2 * k_pairs + 31) / 32 * 32);
  return (elements * 2) % 1024 == 0 ? elements + 32 : elements;
}

MatmulPackedBf16Args checked(const MatmulPackedBf16Args& a, const char* what) {
  PS_CHECK(a.w != nullptr) << what << ": no weight matrix";
  const int64_t k = a.w->cols(), n = a.w->rows();
  PS_CHECK(a.m >= 0) << what << ": negative m=" << a.m;
  MatmulPackedBf16Args r = a;
  if (r.x_stride == 0) r.x_stride = k;
  if (r.y_stride == 0) r.y_stride = n;
  PS_CHECK(r.x_stride >= k && r.y_stride >= n)
      << what << ": strides x=" << r.x_stride << " y=" << r.y_stride << " too small for n=" << n
      << " k=" << k;
  if (a.m > 0 && n > 0) PS_CHECK(a.y != nullptr) << what << ": y is null";
  if (a.m > 0 && k > 0) PS_CHECK(a.x != nullptr) << what << ": x is null";
  return r;
}

void run_tasks(std::span<const Task> tasks, internal::PackedBf16TileFn fn, ThreadPool* pool) {
  internal::split_by_cost(
      pool, static_cast<int64_t>(tasks.size()), kSerialWork,
      [&](int64_t i) { return tasks[static_cast<size_t>(i)].tile.panel_end; },
      [&](int64_t i) { return tasks[static_cast<size_t>(i)].cost_per_panel; },
      [&](int64_t i, int64_t p0, int64_t p1) {
        PackedBf16Tile tile = tasks[static_cast<size_t>(i)].tile;
        tile.panel_begin = p0;
        tile.panel_end = p1;
        fn(tile);
      });
}

}  // namespace

void grouped_matmul_packed_bf16(std::span<const MatmulPackedBf16Args> problems, ThreadPool* pool) {
  const KernelTable& table = internal::active_kernel_table();
  thread_local std::vector<MatmulPackedBf16Args> live;
  thread_local std::vector<Task> tasks;
  live.clear();
  tasks.clear();
  size_t elements = 0;
  for (const MatmulPackedBf16Args& p : problems) {
    const MatmulPackedBf16Args a = checked(p, "grouped_matmul_packed_bf16");
    if (a.m == 0 || a.w->rows() == 0) continue;
    if (a.w->cols() == 0) {  // an empty sum
      if (!a.accumulate) {
        for (int64_t i = 0; i < a.m; ++i) std::fill_n(a.y + i * a.y_stride, a.w->rows(), 0.0f);
      }
      continue;
    }
    live.push_back(a);
    elements += static_cast<size_t>(a.m * activation_stride(a.w->k_pairs()));
  }
  if (live.empty()) return;
  // Problem g's rows go to x + (its first element); the tasks and the rounding pass read the
  // same places, laid out once here.
  struct Rounding {
    const MatmulPackedBf16Args* problem;
    uint16_t* x;
    int64_t stride;
  };
  thread_local std::vector<Rounding> roundings;
  thread_local std::vector<int64_t> first_row;
  roundings.clear();
  first_row.assign(1, 0);
  uint16_t* x = scratch(elements);
  int64_t converted = 0;
  for (const MatmulPackedBf16Args& a : live) {
    const PackedBf16Matrix& w = *a.w;
    const int64_t stride = activation_stride(w.k_pairs());
    roundings.push_back({&a, x, stride});
    first_row.push_back(first_row.back() + a.m);
    converted += a.m * w.cols();
    Task task;
    PackedBf16Tile& t = task.tile;
    t.x = x;
    t.x_stride = stride;
    t.m = a.m;
    t.w = w.panel_data();
    t.panel_stride = w.panel_stride();
    t.k_pairs = w.k_pairs();
    t.panel_begin = 0;
    t.panel_end = w.panels();
    t.y = a.y;
    t.y_stride = a.y_stride;
    t.n = w.rows();
    t.accumulate = a.accumulate;
    task.cost_per_panel = kPanel * 2 * w.k_pairs() * (a.m + kWeightCost);
    tasks.push_back(task);
    x += a.m * stride;
  }
  // Every problem's rows rounded in one pass. A view of this thread's list: the lambda runs
  // on the pool's threads too, where the name of a thread_local variable means that thread's
  // own (empty) copy.
  const std::span<const Rounding> to_round(roundings);
  internal::convert_grouped_rows(first_row, converted, pool, [&](int64_t g, int64_t i) {
    const Rounding& r = to_round[static_cast<size_t>(g)];
    const PackedBf16Matrix& w = *r.problem->w;
    uint16_t* row = r.x + i * r.stride;
    table.fp32_to_bf16(r.problem->x + i * r.problem->x_stride, row, w.cols());
    std::fill(row + w.cols(), row + 2 * w.k_pairs(), uint16_t{0});
  });
  run_tasks(tasks, table.matmul_packed_bf16, pool);
}

void matmul_packed_bf16(const MatmulPackedBf16Args& args, ThreadPool* pool) {
  grouped_matmul_packed_bf16(std::span<const MatmulPackedBf16Args>(&args, 1), pool);
}

bool packed_bf16_is_fast() {
  return internal::active_kernel_table().packed_bf16_fast;
}

}  // namespace peerserve::kernels
