// matmul_int8 / gate_up_silu_int8 and their grouped forms: argument checks, per-token
// quantization of x and the split of panels over threads. The
// arithmetic is in the per-ISA int8 tile functions (internal/kernel_table.h).
#include "kernels/matmul_int8.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "kernels/internal/convert_rows.h"
#include "kernels/internal/kernel_table.h"
#include "kernels/internal/matmul_int8_hooks.h"
#include "kernels/internal/split_by_cost.h"

namespace peerserve::kernels {
namespace {

using internal::Int8Epilogue;
using internal::Int8Tile;
using internal::KernelTable;

constexpr int64_t kPanel = PackedInt8Matrix::kPanelColumns;
// Below this much work (multiply-adds + weight bytes) one thread does it all.
constexpr int64_t kSerialWork = 32 * 1024;
// A weight byte costs about as much to stream as this many rows multiplying it in cache
// (used only to balance threads).
constexpr int64_t kWeightByteCost = 8;

// One problem: tile.panel_begin/end cover all of it; threads take ranges of units
// (a panel, or a gate/up pair of panels).
struct Task {
  Int8Tile tile;
  internal::Int8TileFn fn = nullptr;  // the table whose quantization prepared tile.x
  int64_t units = 0;
  int64_t panels_per_unit = 1;
  int64_t cost_per_unit = 0;
};

// Thread-local scratch for quantized activations, reused across calls.
template <typename T>
T* scratch(size_t elements) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < elements) buffer.resize(elements);
  return buffer.data();
}

// Bytes between quantized rows: k padded to the 4-byte groups, a multiple of 64, plus one
// cache line when rows would be a multiple of 1 KiB apart (L1 set conflicts between the
// rows of a register block).
int64_t quantized_stride(int64_t k_groups) {
  const int64_t bytes = std::max<int64_t>(64, (4 * k_groups + 63) / 64 * 64);
  return bytes % 1024 == 0 ? bytes + 64 : bytes;
}

struct Problem {
  const float* x;
  int64_t x_stride;
  const PackedInt8Matrix* w;
  void* y;
  int64_t y_stride;
  int64_t m;
  bool accumulate;
  Int8Epilogue epilogue;
};

Problem checked(const MatmulInt8Args& a, const char* what) {
  PS_CHECK(a.w != nullptr) << what << ": no weight matrix";
  PS_CHECK(!a.w->is_gate_up()) << what << ": the weight matrix has the gate/up layout";
  const int64_t k = a.w->cols(), n = a.w->rows();
  PS_CHECK(a.m >= 0) << what << ": negative m=" << a.m;
  const int64_t xs = a.x_stride == 0 ? k : a.x_stride, ys = a.y_stride == 0 ? n : a.y_stride;
  PS_CHECK(xs >= k && ys >= n) << what << ": strides x=" << xs << " y=" << ys
                               << " too small for n=" << n << " k=" << k;
  if (a.m > 0 && n > 0) PS_CHECK(a.y != nullptr) << what << ": y is null";
  if (a.m > 0 && k > 0) PS_CHECK(a.x != nullptr) << what << ": x is null";
  return {a.x, xs, a.w, a.y, ys, a.m, a.accumulate, Int8Epilogue::kScale};
}

Problem checked(const GateUpInt8Args& a, const char* what) {
  PS_CHECK(a.gate_up != nullptr) << what << ": no weight matrix";
  PS_CHECK(a.gate_up->is_gate_up()) << what << ": the weight matrix has the plain layout";
  const int64_t k = a.gate_up->cols(), n = a.gate_up->outputs();
  PS_CHECK(a.m >= 0) << what << ": negative m=" << a.m;
  const int64_t xs = a.x_stride == 0 ? k : a.x_stride, ys = a.out_stride == 0 ? n : a.out_stride;
  PS_CHECK(xs >= k && ys >= n) << what << ": strides x=" << xs << " out=" << ys
                               << " too small for n=" << n << " k=" << k;
  if (a.m > 0 && n > 0) PS_CHECK(a.out != nullptr) << what << ": out is null";
  if (a.m > 0 && k > 0) PS_CHECK(a.x != nullptr) << what << ": x is null";
  return {a.x, xs, a.gate_up, a.out, ys, a.m, false, Int8Epilogue::kGateUpSilu};
}

void run_tasks(std::span<const Task> tasks, ThreadPool* pool) {
  internal::split_by_cost(
      pool, static_cast<int64_t>(tasks.size()), kSerialWork,
      [&](int64_t i) { return tasks[static_cast<size_t>(i)].units; },
      [&](int64_t i) { return tasks[static_cast<size_t>(i)].cost_per_unit; },
      [&](int64_t i, int64_t u0, int64_t u1) {
        const Task& task = tasks[static_cast<size_t>(i)];
        Int8Tile tile = task.tile;
        tile.panel_begin = u0 * task.panels_per_unit;
        tile.panel_end = u1 * task.panels_per_unit;
        task.fn(tile);
      });
}

// Quantizes the x rows of every problem into scratch and runs their tiles.
void run_problems(std::span<const Problem> problems, ThreadPool* pool) {
  const KernelTable& table = internal::active_kernel_table();
  size_t bytes = 0, rows = 0;
  for (const Problem& p : problems) {
    bytes += static_cast<size_t>(p.m * quantized_stride(p.w->k_groups()));
    rows += static_cast<size_t>(p.m);
  }
  if (rows == 0) return;
  // Rows of problem g go to xq + (its first byte) with scales at (its first row); the tasks
  // and the quantization pass read the same places, laid out once here.
  struct Quantization {
    const Problem* problem;
    uint8_t* xq;
    float* scales;
    int64_t stride;
  };
  thread_local std::vector<Task> tasks;
  thread_local std::vector<Quantization> quantizations;
  thread_local std::vector<int64_t> first_row;
  tasks.clear();
  quantizations.clear();
  first_row.assign(1, 0);
  uint8_t* xq = scratch<uint8_t>(bytes);
  float* scales = scratch<float>(rows);
  int64_t elements = 0;
  for (const Problem& p : problems) {
    if (p.m == 0) continue;
    const PackedInt8Matrix& w = *p.w;
    const int64_t stride = quantized_stride(w.k_groups());
    quantizations.push_back({&p, xq, scales, stride});
    first_row.push_back(first_row.back() + p.m);
    elements += p.m * w.cols();
    Task task;
    Int8Tile& t = task.tile;
    t.x = xq;
    t.x_stride = stride;
    t.x_scale = scales;
    t.m = p.m;
    t.w = w.panel_data();
    t.panel_stride = w.panel_stride();
    t.k_groups = w.k_groups();
    t.w_scale = w.column_scales();
    t.w_correction = w.column_corrections();
    t.panel_begin = 0;
    t.panel_end = w.panels();
    t.y = p.y;
    t.y_stride = p.y_stride;
    t.n = w.outputs();
    t.accumulate = p.accumulate;
    t.epilogue = p.epilogue;
    t.silu_mul = table.silu_mul;
    task.fn = table.matmul_int8;
    task.panels_per_unit = p.epilogue == Int8Epilogue::kGateUpSilu ? 2 : 1;
    task.units = w.panels() / task.panels_per_unit;
    // At least 1: split_by_cost gives a zero-cost item (k = 0) to no thread, and its y must
    // still be written.
    task.cost_per_unit = std::max<int64_t>(
        1, task.panels_per_unit * kPanel * 4 * w.k_groups() * (p.m + kWeightByteCost));
    if (task.units > 0) tasks.push_back(task);
    xq += p.m * stride;
    scales += p.m;
  }

  // Every problem's rows quantized in one pass. Views of this thread's lists: the lambda
  // runs on the pool's threads too, where the names of thread_local variables mean those
  // threads' own (empty) copies.
  const std::span<const Quantization> to_quantize(quantizations);
  internal::convert_grouped_rows(first_row, elements, pool, [&](int64_t g, int64_t i) {
    const Quantization& q = to_quantize[static_cast<size_t>(g)];
    const PackedInt8Matrix& w = *q.problem->w;
    q.scales[i] =
        table.quantize_row_int8(q.problem->x + i * q.problem->x_stride, w.cols(), 4 * w.k_groups(),
                                table.int8_activation_offset, q.xq + i * q.stride);
  });
  run_tasks(tasks, pool);
}

template <typename Args>
void run_checked(std::span<const Args> problems, const char* what, ThreadPool* pool) {
  // Kept between calls: no allocation per product (the caller's thread runs one at a time).
  thread_local std::vector<Problem> checked_problems;
  checked_problems.clear();
  for (const Args& a : problems) checked_problems.push_back(checked(a, what));
  run_problems(checked_problems, pool);
}

}  // namespace

void matmul_int8(const MatmulInt8Args& args, ThreadPool* pool) {
  run_checked(std::span<const MatmulInt8Args>(&args, 1), "matmul_int8", pool);
}

void grouped_matmul_int8(std::span<const MatmulInt8Args> problems, ThreadPool* pool) {
  run_checked(problems, "grouped_matmul_int8", pool);
}

void gate_up_silu_int8(const GateUpInt8Args& args, ThreadPool* pool) {
  run_checked(std::span<const GateUpInt8Args>(&args, 1), "gate_up_silu_int8", pool);
}

void grouped_gate_up_silu_int8(std::span<const GateUpInt8Args> problems, ThreadPool* pool) {
  run_checked(problems, "grouped_gate_up_silu_int8", pool);
}

namespace internal {

void matmul_int8_accumulators(const MatmulInt8Args& args, int32_t* acc, int64_t acc_stride,
                              ThreadPool* pool) {
  Problem p = checked(args, "matmul_int8_accumulators");
  p.y = acc;
  p.y_stride = acc_stride;
  p.accumulate = false;
  p.epilogue = Int8Epilogue::kInt32;
  run_problems(std::span<const Problem>(&p, 1), pool);
}

float quantize_activation_row(const float* x, int64_t k, int8_t* q) {
  const KernelTable& table = active_kernel_table();
  std::vector<uint8_t> bytes(static_cast<size_t>((k + 3) / 4 * 4));
  const float scale = table.quantize_row_int8(x, k, static_cast<int64_t>(bytes.size()),
                                              table.int8_activation_offset, bytes.data());
  for (int64_t p = 0; p < k; ++p) {
    q[p] = static_cast<int8_t>(
        static_cast<uint8_t>(bytes[static_cast<size_t>(p)] - table.int8_activation_offset));
  }
  return scale;
}

}  // namespace internal
}  // namespace peerserve::kernels
