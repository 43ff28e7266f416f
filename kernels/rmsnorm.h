// RMSNorm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]
//
// The mean of squares is summed in fp32 in a fixed order per row (batch-invariant), then
// the reciprocal square root is taken in fp32. out may equal x (in place); otherwise they
// must not overlap. Strides are in elements, 0 meaning dim.
#pragma once

#include <cstdint>

#include "tensor/float_convert.h"

namespace peerserve::kernels {

struct RmsNormArgs {
  const float* x = nullptr;  // [rows, dim]
  int64_t x_stride = 0;
  float* out = nullptr;  // [rows, dim]
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;  // rms_norm_eps
};

void rmsnorm(const RmsNormArgs& args, const float* weight);  // weight [dim], fp32
void rmsnorm(const RmsNormArgs& args, const bf16* weight);   // weight [dim], bf16 (checkpoints)

}  // namespace peerserve::kernels
