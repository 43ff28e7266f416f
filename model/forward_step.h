// Internal: how one forward step's ragged batch is laid out for the layers.
//
// All new tokens of all chunks are stacked into one activation matrix of num_rows rows
// (chunk by chunk, in order); every layer runs its projections over the whole stack, and
// attention walks the chunks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "model/deepseek_weights.h"

namespace peerserve {

struct StepChunk {
  int64_t row_begin = 0;   // first row of the stacked activations
  int64_t num_tokens = 0;  // rows of this chunk
  int64_t start_pos = 0;   // position of its first row
  std::span<const int32_t> block_table;
  bool absorbed = false;  // attention form for this chunk
  int64_t context() const { return start_pos + num_tokens; }
};

struct StepRows {
  std::vector<StepChunk> chunks;
  int64_t num_rows = 0;
  std::vector<int64_t> positions;  // [num_rows]
  std::vector<float> rope_cos;     // [num_rows, qk_rope_head_dim / 2]
  std::vector<float> rope_sin;     // [num_rows, qk_rope_head_dim / 2]
};

struct ComputeContext {
  ThreadPool* pool = nullptr;
  kernels::ActivationPrecision precision = kernels::ActivationPrecision::kBf16;
};

// fn(begin, end, part) over row ranges covering [0, rows), part < row_range_parts(ctx) (one
// range per part: per-part scratch). On the pool's threads for a prefill's many rows, on the
// calling thread as part 0 for a decode step's few (a pool hand-off costs microseconds). For
// per-row work whose result does not depend on the split (routing, the SiLU gate, the
// top-k combine): a prefill's serial row loops left a core idle.
inline int row_range_parts(const ComputeContext& ctx) {
  return ctx.pool == nullptr ? 1 : ctx.pool->num_threads();
}

template <typename Fn>
void for_row_ranges(const ComputeContext& ctx, int64_t rows, Fn&& fn) {
  constexpr int64_t kParallelRows = 64;
  if (ctx.pool == nullptr || rows < kParallelRows) {
    fn(int64_t{0}, rows, 0);
    return;
  }
  ctx.pool->run_on_all(
      [&](int part, int parts) { fn(rows * part / parts, rows * (part + 1) / parts, part); });
}

// kernels::rmsnorm over row ranges (for_row_ranges): the same bits, on both cores for a
// prefill's rows (it ran on the calling thread while the other core waited).
void rmsnorm_rows(const ComputeContext& ctx, const kernels::RmsNormArgs& args, const float* weight);

// x[r, :] += y[r, :] for r < rows (dim wide, dense): the residual adds, over row ranges.
void add_rows(const ComputeContext& ctx, float* x, const float* y, int64_t rows, int64_t dim);

// y[m, w.rows] (+)= x[m, w.cols] w^T; strides in elements (0: dense). W8A8 when w has an
// INT8 form (kernels/matmul_int8.h), else the BF16 product at ctx.precision: over the
// packed form when w has one and the precision is kBf16 (kernels/matmul_packed_bf16.h),
// over the checkpoint layout otherwise.
void linear(const ComputeContext& ctx, const float* x, int64_t m, const LinearWeight& w, float* y,
            int64_t x_stride = 0, int64_t y_stride = 0, bool accumulate = false);

// Several independent products in one call (one pass of the thread pool per weight kind).
struct LinearProblem {
  const float* x = nullptr;
  int64_t x_stride = 0;
  const LinearWeight* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
  int64_t m = 0;
  bool accumulate = false;
};
void grouped_linear(const ComputeContext& ctx, std::span<const LinearProblem> problems);

// The BF16 products of `problems`, whatever INT8 forms their weights have (as linear() picks
// between packed and checkpoint layout); records nothing (callers record what they want).
void grouped_bf16_linear(const ComputeContext& ctx, std::span<const LinearProblem> problems);

// out[rows, hidden] = down(SiLU(x gate^T) * (x up^T)) of an MLP without an INT8 gate/up form:
// gate and up as one grouped BF16 product, then the down projection (linear()). gate and up
// are scratch of rows * inter floats each. The model's MLPs and shared experts run here, and
// so does a shared expert run whole on another rank, so both give the same bits.
void bf16_mlp(const ComputeContext& ctx, const MlpWeights& w, const float* x, int64_t rows,
              float* gate, float* up, float* out);

// Calibration hook (model/int8_calibration.h): sees the input of every linear layer the
// forward runs in BF16 (linear(), grouped_linear(), the local routed experts). Off by default;
// when off the forward pays one relaxed load per call. Process-wide: set it only while one
// model runs (the calibration pass), never while serving.
class LinearInputRecorder {
 public:
  virtual ~LinearInputRecorder() = default;
  // The m rows (`cols` floats each, row stride `stride`, 0: dense) that multiply the weight
  // whose BF16 data starts at `weight` (the weight's identity: its checkpoint view).
  virtual void record(const bf16* weight, const float* x, int64_t m, int64_t cols,
                      int64_t stride) = 0;
  // The post-attention-norm input of MoE layer `layer` (all tokens; the shared expert's and
  // the router's input), [m, cols].
  virtual void record_moe_input(int64_t layer, const float* x, int64_t m, int64_t cols) = 0;
};
// nullptr (the default) turns recording off.
void set_linear_input_recorder(LinearInputRecorder* recorder);
LinearInputRecorder* linear_input_recorder();

}  // namespace peerserve
