#include "model/forward_step.h"

namespace peerserve {

void linear(const ComputeContext& ctx, const float* x, int64_t m, const Bf16Matrix& w, float* y,
            int64_t x_stride, int64_t y_stride, bool accumulate) {
  kernels::MatmulBf16Args args;
  args.x = x;
  args.x_stride = x_stride;
  args.w = w.data;
  args.y = y;
  args.y_stride = y_stride;
  args.m = m;
  args.n = w.rows;
  args.k = w.cols;
  args.accumulate = accumulate;
  kernels::matmul_bf16(args, ctx.precision, ctx.pool);
}

}  // namespace peerserve
