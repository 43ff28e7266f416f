#include "model/rotary_embedding.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <string>

#include "base/check.h"

namespace peerserve {
namespace {

// The dimension index at which rotations complete num_rotations turns within max_pos.
double yarn_find_correction_dim(double num_rotations, double dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double mla_softmax_scale(const ModelConfig& config) {
  double scale = 1.0 / std::sqrt(static_cast<double>(config.qk_head_dim()));
  if (config.rope_scaling && config.rope_scaling->mscale_all_dim != 0.0) {
    const double m =
        yarn_get_mscale(config.rope_scaling->factor, config.rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

Status check_rope_values(const ModelConfig& config) {
  auto fields = [&] {
    std::ostringstream out;
    out << "rope_theta " << config.rope_theta;
    if (config.rope_scaling) {
      const YarnScaling& y = *config.rope_scaling;
      out << " with YaRN factor " << y.factor << ", beta_fast " << y.beta_fast << ", beta_slow "
          << y.beta_slow << ", mscale " << y.mscale << ", mscale_all_dim " << y.mscale_all_dim
          << ", original_max_position_embeddings " << y.original_max_position_embeddings;
    }
    return out.str();
  };
  if (config.qk_rope_head_dim <= 0 || config.qk_rope_head_dim % 2 != 0) {
    return invalid_argument("qk_rope_head_dim " + std::to_string(config.qk_rope_head_dim) +
                            ": expected a positive even number");
  }
  const RotaryEmbedding rope(config);
  for (size_t i = 0; i < rope.inv_freq().size(); ++i) {
    const float f = rope.inv_freq()[i];
    if (!std::isfinite(f) || !(f > 0.0f)) {
      return invalid_argument(fields() + " give RoPE frequency " + std::to_string(i) + " = " +
                              std::to_string(f) + ", expected a finite positive number");
    }
  }
  if (!std::isfinite(rope.mscale()) || !(rope.mscale() > 0.0f)) {
    return invalid_argument(fields() + " give a cos/sin scale of " + std::to_string(rope.mscale()) +
                            ", expected a finite positive number");
  }
  const float softmax_scale = static_cast<float>(mla_softmax_scale(config));
  if (!std::isfinite(softmax_scale) || !(softmax_scale > 0.0f)) {
    return invalid_argument(fields() + " give an attention softmax scale of " +
                            std::to_string(softmax_scale) + ", expected a finite positive number");
  }
  return ok_status();
}

RotaryEmbedding::RotaryEmbedding(const ModelConfig& config) : dim_(config.qk_rope_head_dim) {
  PS_CHECK(dim_ > 0 && dim_ % 2 == 0) << "qk_rope_head_dim " << dim_;
  const int64_t half = dim_ / 2;
  // The frequencies are computed in fp32 in Hugging Face's order of operations (its rope
  // initialization), so that they come out as the same floats:
  //   pos_freq = base ** (float(2i) / dim)        (fp32 pow)
  //   inv_freq = 1 / pos_freq                     (plain RoPE)
  // and with YaRN the blend of 1 / pos_freq and 1 / (factor * pos_freq) by a linear ramp.
  // Computed in double and rounded once, 10 of DeepSeek-V3's 32 differed by an ulp, which
  // moves cos/sin by ~1e-3 at position 100,000; now all 32 are torch's (the pow of two
  // libraries can still differ by an ulp: 1 of 32 at theta 50,000).
  const float base = static_cast<float>(config.rope_theta);
  const float dim = static_cast<float>(dim_);
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    pos_freq[i] = std::pow(base, static_cast<float>(2 * i) / dim);
  }
  inv_freq_.resize(half);
  if (!config.rope_scaling) {
    for (int64_t i = 0; i < half; ++i) inv_freq_[i] = 1.0f / pos_freq[i];
    return;
  }
  const YarnScaling& yarn = *config.rope_scaling;
  const double d = static_cast<double>(dim_);
  const double orig = static_cast<double>(yarn.original_max_position_embeddings);
  const double theta = config.rope_theta;
  // The ramp's ends are Python floats in the reference (double), used in fp32 arithmetic.
  double low = std::floor(yarn_find_correction_dim(yarn.beta_fast, d, theta, orig));
  double high = std::ceil(yarn_find_correction_dim(yarn.beta_slow, d, theta, orig));
  low = std::max(low, 0.0);
  high = std::min(high, d - 1.0);
  if (low == high) high += 0.001;  // avoid a zero-width ramp, as HF does
  const float low_f = static_cast<float>(low), width = static_cast<float>(high - low);
  const float factor = static_cast<float>(yarn.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float extrapolation = 1.0f / pos_freq[i];
    const float interpolation = 1.0f / (factor * pos_freq[i]);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / width, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    inv_freq_[i] =
        interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  mscale_ = static_cast<float>(yarn_get_mscale(yarn.factor, yarn.mscale) /
                               yarn_get_mscale(yarn.factor, yarn.mscale_all_dim));
}

void RotaryEmbedding::cos_sin(int64_t pos, float* cos, float* sin) const {
  const float t = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float angle = t * inv_freq_[i];
    cos[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * mscale_;
    sin[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * mscale_;
  }
}

void RotaryEmbedding::rotate(const float* cos, const float* sin, float* x) const {
  const int64_t half = dim_ / 2;
  float tmp[512];
  PS_CHECK_LE(dim_, 512);
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    tmp[i] = a * cos[i] - b * sin[i];
    tmp[half + i] = b * cos[i] + a * sin[i];
  }
  std::copy(tmp, tmp + dim_, x);
}

}  // namespace peerserve
