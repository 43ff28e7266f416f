// Small vector operations for attention and routing. Each sums in a fixed order for a
// given ISA level (batch-invariant). Pointers need only element alignment.
#pragma once

#include <cstdint>

#include "tensor/float_convert.h"

namespace peerserve::kernels {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, int64_t n);
float dot(const float* a, const bf16* b, int64_t n);

// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, int64_t n);
void axpy(float alpha, const bf16* x, float* y, int64_t n);

// x[i] *= alpha
void scale(float alpha, float* x, int64_t n);

}  // namespace peerserve::kernels
