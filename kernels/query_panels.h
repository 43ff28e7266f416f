// Attention scores of a query's heads against cached bf16 keys, in the packed outer-product
// form of kernels/matmul_packed_bf16.h with the roles turned around: the queries of up to 16
// heads are packed once into a panel (the layout of kernels/bf16_matrix.h, rounded to bf16),
// and each run of cached keys is the activation side, read in place:
//
//   scores[j * scores_stride + h] = sum_p bf16(q[h, p]) * key[j, p]     j < tokens, h < heads
//
// Why: the decode attention's scores (every head against every cached latent) were dot
// products over the key width, one horizontal reduction per score and a widening of every
// key element, at about a fifth of the fp32 FMA peak (docs/kernels.md, "Decode attention
// scores"). Here each key pair is one broadcast feeding a vdpbf16ps (or two FMAs) for 16
// heads at once, and a head's scores come out as lanes.
//
// Accuracy: that of matmul_packed_bf16 — each score is the fp32 sum, in p order per lane,
// of exact bf16 x bf16 products: |error| <= (width + 2) * 2^-24 * sum_p |q_p key_p| against
// the exact sum of the same products; the queries' rounding to bf16 is the
// ActivationPrecision::kBf16 rounding every GEMM input gets. Row invariance: a key's scores
// are bitwise the same whichever other keys share the call.
//
// Ownership and thread-safety: owns its panels (reused across pack calls, so a steady
// decode allocates nothing); one thread packs, then any number may score.
#pragma once

#include <cstdint>

#include "base/aligned_buffer.h"
#include "tensor/float_convert.h"

namespace peerserve::kernels {

class QueryPanels {
 public:
  static constexpr int64_t kHeadsPerPanel = 16;

  // Keys are read in pairs of elements: the width must be even (and positive).
  static bool supports_width(int64_t width) { return width > 0 && width % 2 == 0; }

  // Packs q[h * q_stride + p] for h < heads, p < width. REQUIRES: heads >= 1,
  // supports_width(width), q_stride >= width.
  void pack(const float* q, int64_t q_stride, int64_t heads, int64_t width);

  // The scores of `tokens` keys (row j at keys + j * key_stride, width elements, 4-byte
  // aligned rows) against the packed heads; writes scores[j * scores_stride + h] for
  // h < heads only. REQUIRES: pack was called, key_stride >= width and even,
  // scores_stride >= heads.
  void score(const bf16* keys, int64_t key_stride, int64_t tokens, float* scores,
             int64_t scores_stride) const;

  int64_t heads() const { return heads_; }
  int64_t width() const { return width_; }

 private:
  AlignedBuffer storage_;  // grown, never shrunk: the panels of the last pack
  uint16_t* panels_ = nullptr;
  int64_t heads_ = 0;
  int64_t width_ = 0;
  int64_t panel_stride_ = 0;  // bf16 elements
};

}  // namespace peerserve::kernels
