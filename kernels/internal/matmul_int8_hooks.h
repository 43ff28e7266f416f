// Test hooks of kernels/matmul_int8.cc (not for the engine).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/matmul_int8.h"

namespace peerserve::kernels::internal {

// The exact int32 sums acc[i, j] = sum_k xq[i, k] * q[j, k] that matmul_int8 scales, at the
// active level, into acc [m, n] with row stride acc_stride (elements, >= n).
void matmul_int8_accumulators(const MatmulInt8Args& args, int32_t* acc, int64_t acc_stride,
                              ThreadPool* pool);

// One row of x quantized as the active level does it: q[0, k) signed values; returns sx.
float quantize_activation_row(const float* x, int64_t k, int8_t* q);

}  // namespace peerserve::kernels::internal
