// Numerically stable softmax of one row, in place: x[i] = exp(x[i] - max) / sum.
// A row of all -inf (fully masked) becomes all zeros rather than NaN; a row holding NaN
// becomes NaN (all of it when its other values are -inf). And its unnormalised weights,
// exp_offset.
#pragma once

#include <cstdint>

namespace peerserve::kernels {

void softmax(float* x, int64_t n);

// out[i] = exp(x[i] - offset): softmax's weights before normalising (the sampler's). Within
// 2 ulp of the correctly rounded value above 2^-125 (below, 0 at some levels); -inf gives 0.
void exp_offset(const float* x, float offset, float* out, int64_t n);

}  // namespace peerserve::kernels
