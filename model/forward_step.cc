#include "model/forward_step.h"

#include <atomic>
#include <vector>

#include "kernels/activation.h"
#include "kernels/matmul_int8.h"
#include "kernels/matmul_packed_bf16.h"

namespace peerserve {
namespace {
std::atomic<LinearInputRecorder*> g_recorder{nullptr};
}  // namespace

void set_linear_input_recorder(LinearInputRecorder* recorder) {
  g_recorder.store(recorder, std::memory_order_release);
}

LinearInputRecorder* linear_input_recorder() {
  return g_recorder.load(std::memory_order_acquire);
}

void rmsnorm_rows(const ComputeContext& ctx, const kernels::RmsNormArgs& args,
                  const float* weight) {
  const int64_t x_stride = args.x_stride == 0 ? args.dim : args.x_stride;
  const int64_t out_stride = args.out_stride == 0 ? args.dim : args.out_stride;
  for_row_ranges(ctx, args.rows, [&](int64_t r0, int64_t r1, int) {
    kernels::RmsNormArgs part = args;
    part.x = args.x + r0 * x_stride;
    part.x_stride = x_stride;
    part.out = args.out + r0 * out_stride;
    part.out_stride = out_stride;
    part.rows = r1 - r0;
    kernels::rmsnorm(part, weight);
  });
}

void add_rows(const ComputeContext& ctx, float* x, const float* y, int64_t rows, int64_t dim) {
  for_row_ranges(ctx, rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t i = r0 * dim; i < r1 * dim; ++i) x[i] += y[i];
  });
}

void linear(const ComputeContext& ctx, const float* x, int64_t m, const LinearWeight& w, float* y,
            int64_t x_stride, int64_t y_stride, bool accumulate) {
  const LinearProblem problem{x, x_stride, &w, y, y_stride, m, accumulate};
  grouped_linear(ctx, std::span<const LinearProblem>(&problem, 1));
}

void grouped_bf16_linear(const ComputeContext& ctx, std::span<const LinearProblem> problems) {
  // Reused per thread: a steady decode step allocates nothing (the expert-parallel path
  // counts allocations).
  thread_local std::vector<kernels::MatmulBf16Args> plain;
  thread_local std::vector<kernels::MatmulPackedBf16Args> packed;
  plain.clear();
  packed.clear();
  for (const LinearProblem& p : problems) {
    if (p.w->bf16_packed && ctx.precision == kernels::ActivationPrecision::kBf16) {
      kernels::MatmulPackedBf16Args a;
      a.x = p.x;
      a.x_stride = p.x_stride;
      a.w = p.w->bf16_packed.get();
      a.y = p.y;
      a.y_stride = p.y_stride;
      a.m = p.m;
      a.accumulate = p.accumulate;
      packed.push_back(a);
    } else {
      kernels::MatmulBf16Args a;
      a.x = p.x;
      a.x_stride = p.x_stride;
      a.w = p.w->data;
      a.y = p.y;
      a.y_stride = p.y_stride;
      a.m = p.m;
      a.n = p.w->rows;
      a.k = p.w->cols;
      a.accumulate = p.accumulate;
      plain.push_back(a);
    }
  }
  if (!packed.empty()) kernels::grouped_matmul_packed_bf16(packed, ctx.pool);
  if (!plain.empty()) kernels::grouped_matmul_bf16(plain, ctx.precision, ctx.pool);
}

void bf16_mlp(const ComputeContext& ctx, const MlpWeights& w, const float* x, int64_t rows,
              float* gate, float* up, float* out) {
  const int64_t inter = w.gate.rows;
  const LinearProblem problems[2] = {{.x = x, .w = &w.gate, .y = gate, .m = rows},
                                     {.x = x, .w = &w.up, .y = up, .m = rows}};
  grouped_bf16_linear(ctx, problems);
  for_row_ranges(ctx, rows, [&](int64_t r0, int64_t r1, int) {
    kernels::silu_mul(gate + r0 * inter, up + r0 * inter, gate + r0 * inter, (r1 - r0) * inter);
  });
  linear(ctx, gate, rows, w.down, out);
}

void grouped_linear(const ComputeContext& ctx, std::span<const LinearProblem> problems) {
  thread_local std::vector<LinearProblem> bf16;
  thread_local std::vector<kernels::MatmulInt8Args> int8;
  bf16.clear();
  int8.clear();
  LinearInputRecorder* recorder = g_recorder.load(std::memory_order_relaxed);
  for (const LinearProblem& p : problems) {
    if (recorder != nullptr && !p.w->int8) {
      recorder->record(p.w->data, p.x, p.m, p.w->cols, p.x_stride);
    }
    if (p.w->int8) {
      kernels::MatmulInt8Args a;
      a.x = p.x;
      a.x_stride = p.x_stride;
      a.w = p.w->int8.get();
      a.y = p.y;
      a.y_stride = p.y_stride;
      a.m = p.m;
      a.accumulate = p.accumulate;
      int8.push_back(a);
    } else {
      bf16.push_back(p);
    }
  }
  if (!bf16.empty()) grouped_bf16_linear(ctx, bf16);
  if (!int8.empty()) {
    kernels::grouped_matmul_int8(int8, ctx.pool);
    for (const LinearProblem& p : problems) {
      if (p.w->int8) add_int8_compensation(*p.w, p.m, p.y, p.y_stride);
    }
  }
}

}  // namespace peerserve
