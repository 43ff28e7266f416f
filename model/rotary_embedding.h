// Decoupled RoPE of MLA (the qk_rope_head_dim part of queries and keys), with optional YaRN
// context extension, as in Hugging Face's modeling_deepseek.py:
//
//   inv_freq[i] = base^(-2i/d)                            (plain RoPE)
//   YaRN: freq_extra = base^(-2i/d), freq_inter = freq_extra / factor,
//         [low, high] = yarn_find_correction_range(beta_fast, beta_slow, d, base, orig_max),
//         mask[i] = 1 - clamp((i - low) / (high - low), 0, 1),
//         inv_freq = freq_inter * (1 - mask) + freq_extra * mask
//   cos/sin(pos)[i] = cos/sin(pos * inv_freq[i]) * mscale, i < d/2 (repeated for both halves)
//   with mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim).
//
// The checkpoint's rope dims are stored as interleaved pairs; HF permutes them to the
// "halves" order (x[0], x[2], ..., x[1], x[3], ...) before rotate_half, so the rotated
// vector comes out in halves order. Queries and keys both use it, so their dot products
// are the same as HF's.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/model_config.h"

namespace peerserve {

// yarn_get_mscale(scale, mscale) = 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

// The attention softmax scale: qk_head_dim^-0.5, times yarn_get_mscale(factor,
// mscale_all_dim)^2 under YaRN (when mscale_all_dim is set).
double mla_softmax_scale(const ModelConfig& config);

// The values the RoPE fields of a parsed config lead to, checked: every frequency finite and
// positive, the cos/sin scale and the softmax scale finite and positive in fp32. Each field is
// bounded on its own when parsed; this catches combinations (InvalidArgument naming them).
Status check_rope_values(const ModelConfig& config);

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelConfig& config);

  int64_t dim() const { return dim_; }
  // [dim / 2], computed in fp32 in Hugging Face's order of operations.
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // Factor applied to cos and sin (1 without YaRN).
  float mscale() const { return mscale_; }

  // cos[i], sin[i] for i < dim/2 at position pos: the angle is rounded to fp32 first
  // (HF takes the outer product t * inv_freq in fp32).
  void cos_sin(int64_t pos, float* cos, float* sin) const;

  // Rotates x[0, dim) (checkpoint pair order) in place into the halves order, given the
  // cos/sin of its position.
  void rotate(const float* cos, const float* sin, float* x) const;

 private:
  int64_t dim_;
  std::vector<float> inv_freq_;
  float mscale_ = 1.0f;
};

}  // namespace peerserve
