// Numerically stable softmax of one row, in place: x[i] = exp(x[i] - max) / sum.
// A row of all -inf (fully masked) becomes all zeros rather than NaN.
#pragma once

#include <cstdint>

namespace peerserve::kernels {

void softmax(float* x, int64_t n);

}  // namespace peerserve::kernels
