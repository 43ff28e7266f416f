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

// out[d] = sum_{j < count} w[j] * rows[j][d] for d < n: bit for bit zeroing out, then
// axpy(w[j], rows[j], out, n) for j in order, but each out element is written once (an MoE
// combine of a token's top-k expert outputs, wherever they lie).
void weighted_sum(const float* w, const float* const* rows, int64_t count, float* out, int64_t n);
void weighted_sum(const float* w, const bf16* const* rows, int64_t count, float* out, int64_t n);

// Attention-weighted sums of rows: o[r, d] += sum_{j < tokens} p[r, j] * v[j, d] for r < rows,
// d < dim (row r of p at p + r * p_stride, of v at v + j * v_stride, of o at o + r * o_stride).
// Bit for bit the same as axpy(p[r, j], v[j], o[r]) for j in order, r in any order: each v row
// is read once for all rows of p.
void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const float* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim);
void weighted_rows(const float* p, int64_t p_stride, int64_t rows, const bf16* v, int64_t v_stride,
                   int64_t tokens, float* o, int64_t o_stride, int64_t dim);

// x[i] *= alpha
void scale(float alpha, float* x, int64_t n);

// The index of the first largest value among the non-NaN x[i] (i < n): the first of equal
// maxima (-0 and +0 are equal), the first non-NaN when all are -inf, 0 when every value is
// NaN or n <= 0. Greedy decoding's choice over a vocabulary of logits.
int64_t argmax(const float* x, int64_t n);

}  // namespace peerserve::kernels
