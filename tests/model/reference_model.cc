#include "tests/model/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/check.h"

namespace peerserve::testing {
namespace {

double to_double(const WeightTensor& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float f;
    std::memcpy(&f, static_cast<const char*>(t.data) + 4 * i, 4);
    return f;
  }
  PS_CHECK(t.dtype == DType::kBF16) << "reference reads only BF16/F32 checkpoints";
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(t.data) + 2 * i, 2);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  PS_CHECK_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

// Indices of the k largest values, largest first (ties: lower index first).
std::vector<int> top_indices(const std::vector<double>& values, int k) {
  std::vector<int> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return values[a] > values[b]; });
  idx.resize(k);
  return idx;
}

// HF's yarn helpers, in double.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * M_PI)) / (2 * std::log(base));
}

}  // namespace

ReferenceModel::ReferenceModel(Checkpoint& checkpoint)
    : checkpoint_(checkpoint), c_(checkpoint.config()) {}

const Matrix& ReferenceModel::weight(const std::string& name) {
  auto it = matrices_.find(name);
  if (it != matrices_.end()) return it->second;
  auto raw = checkpoint_.get_raw(name);
  PS_CHECK(raw.ok()) << raw.status().to_string();
  PS_CHECK_EQ(raw->shape.size(), 2u);
  Matrix m(raw->shape[0], std::vector<double>(raw->shape[1]));
  for (int64_t r = 0; r < raw->shape[0]; ++r) {
    for (int64_t k = 0; k < raw->shape[1]; ++k) m[r][k] = to_double(*raw, r * raw->shape[1] + k);
  }
  return matrices_.emplace(name, std::move(m)).first->second;
}

const std::vector<double>& ReferenceModel::vec(const std::string& name) {
  auto it = vectors_.find(name);
  if (it != vectors_.end()) return it->second;
  auto raw = checkpoint_.get_raw(name);
  PS_CHECK(raw.ok()) << raw.status().to_string();
  std::vector<double> v(raw->numel());
  for (int64_t i = 0; i < raw->numel(); ++i) v[i] = to_double(*raw, i);
  return vectors_.emplace(name, std::move(v)).first->second;
}

Matrix ReferenceModel::linear(const Matrix& x, const std::string& name) {
  const Matrix& w = weight(name);
  Matrix y(x.size(), std::vector<double>(w.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t j = 0; j < w.size(); ++j) y[i][j] = dot(x[i], w[j]);
  }
  return y;
}

Matrix ReferenceModel::rmsnorm(const Matrix& x, const std::string& name,
                               std::optional<double> eps) {
  const std::vector<double>& w = vec(name);
  const double epsilon = eps.value_or(c_.rms_norm_eps);
  Matrix y = x;
  for (auto& row : y) {
    const double ms = dot(row, row) / static_cast<double>(row.size());
    const double inv = 1.0 / std::sqrt(ms + epsilon);
    for (size_t k = 0; k < row.size(); ++k) row[k] = w[k] * (row[k] * inv);
  }
  return y;
}

// HF: q.view(..., d/2, 2).transpose -> halves order, then q*cos + rotate_half(q)*sin with
// the (YaRN) cos/sin tables.
void ReferenceModel::rope(std::vector<double>& x, int64_t pos) const {
  const int64_t d = static_cast<int64_t>(x.size()), half = d / 2;
  const double base = c_.rope_theta;
  std::vector<double> inv_freq(half);
  double mscale = 1.0;
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(base, 2.0 * i / d);
  if (c_.rope_scaling) {
    const YarnScaling& y = *c_.rope_scaling;
    double low =
        std::floor(correction_dim(y.beta_fast, d, base, y.original_max_position_embeddings));
    double high =
        std::ceil(correction_dim(y.beta_slow, d, base, y.original_max_position_embeddings));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double extra = inv_freq[i], inter = extra / y.factor;
      const double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
      const double extra_mask = 1.0 - ramp;
      inv_freq[i] = inter * (1 - extra_mask) + extra * extra_mask;
    }
    mscale = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  }
  std::vector<double> halves(d), cos(d), sin(d), rotated(d);
  for (int64_t i = 0; i < half; ++i) {
    halves[i] = x[2 * i];
    halves[half + i] = x[2 * i + 1];
    cos[i] = cos[half + i] = std::cos(pos * inv_freq[i]) * mscale;
    sin[i] = sin[half + i] = std::sin(pos * inv_freq[i]) * mscale;
  }
  for (int64_t i = 0; i < half; ++i) {  // rotate_half: [-x2, x1]
    rotated[i] = -halves[half + i];
    rotated[half + i] = halves[i];
  }
  for (int64_t i = 0; i < d; ++i) x[i] = halves[i] * cos[i] + rotated[i] * sin[i];
}

Matrix ReferenceModel::attention(const Matrix& x, const std::string& p) {
  const int64_t n = static_cast<int64_t>(x.size()), heads = c_.num_attention_heads;
  const int64_t nope = c_.qk_nope_head_dim, rope_dim = c_.qk_rope_head_dim, v_dim = c_.v_head_dim;
  const int64_t qk = nope + rope_dim, lora = c_.kv_lora_rank;
  Matrix q =
      c_.q_lora_rank
          ? linear(rmsnorm(linear(x, p + "q_a_proj.weight"), p + "q_a_layernorm.weight", 1e-6),
                   p + "q_b_proj.weight")
          : linear(x, p + "q_proj.weight");
  Matrix ckv = linear(x, p + "kv_a_proj_with_mqa.weight");
  Matrix latent(n), k_pe(n);
  for (int64_t i = 0; i < n; ++i) {
    latent[i].assign(ckv[i].begin(), ckv[i].begin() + lora);
    k_pe[i].assign(ckv[i].begin() + lora, ckv[i].end());
    rope(k_pe[i], i);
  }
  const Matrix kv =
      linear(rmsnorm(latent, p + "kv_a_layernorm.weight", 1e-6), p + "kv_b_proj.weight");
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c_.rope_scaling && c_.rope_scaling->mscale_all_dim != 0) {
    const double m = yarn_mscale(c_.rope_scaling->factor, c_.rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  Matrix out(n, std::vector<double>(heads * v_dim, 0.0));
  for (int64_t h = 0; h < heads; ++h) {
    Matrix keys(n), queries(n);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<double> q_pe(q[j].begin() + h * qk + nope, q[j].begin() + (h + 1) * qk);
      rope(q_pe, j);
      queries[j].assign(q[j].begin() + h * qk, q[j].begin() + h * qk + nope);
      queries[j].insert(queries[j].end(), q_pe.begin(), q_pe.end());
      keys[j].assign(kv[j].begin() + h * (nope + v_dim), kv[j].begin() + h * (nope + v_dim) + nope);
      keys[j].insert(keys[j].end(), k_pe[j].begin(), k_pe[j].end());
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> s(i + 1);
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) max = std::max(max, s[j] = dot(queries[i], keys[j]) * scale);
      for (int64_t j = 0; j <= i; ++j) sum += s[j] = std::exp(s[j] - max);
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t d = 0; d < v_dim; ++d) {
          out[i][h * v_dim + d] += s[j] / sum * kv[j][h * (nope + v_dim) + nope + d];
        }
      }
    }
  }
  return linear(out, p + "o_proj.weight");
}

Matrix ReferenceModel::mlp(const Matrix& x, const std::string& p) {
  Matrix g = linear(x, p + "gate_proj.weight");
  const Matrix u = linear(x, p + "up_proj.weight");
  for (size_t i = 0; i < g.size(); ++i) {
    for (size_t k = 0; k < g[i].size(); ++k) g[i][k] = silu(g[i][k]) * u[i][k];
  }
  return linear(g, p + "down_proj.weight");
}

Matrix ReferenceModel::moe(const Matrix& x, const std::string& p) {
  const int64_t n_exp = c_.n_routed_experts, top_k = c_.num_experts_per_tok;
  const Matrix logits = linear(x, p + "gate.weight");
  Matrix out = c_.n_shared_experts > 0 ? mlp(x, p + "shared_experts.")
                                       : Matrix(x.size(), std::vector<double>(x[0].size(), 0.0));
  for (size_t t = 0; t < x.size(); ++t) {
    std::vector<double> scores(n_exp), choice(n_exp);
    if (c_.scoring_func == ScoringFunc::kSigmoid) {
      for (int64_t e = 0; e < n_exp; ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[t][e]));
    } else {
      double sum = 0;
      for (int64_t e = 0; e < n_exp; ++e) sum += scores[e] = std::exp(logits[t][e]);
      for (double& s : scores) s /= sum;
    }
    choice = scores;
    if (c_.topk_method == TopkMethod::kNoAuxTc) {
      const std::vector<double>& bias = vec(p + "gate.e_score_correction_bias");
      for (int64_t e = 0; e < n_exp; ++e) choice[e] += bias[e];
    }
    if (c_.topk_method != TopkMethod::kGreedy) {
      const int64_t per_group = n_exp / c_.n_group;
      std::vector<double> group_scores(c_.n_group);
      for (int64_t g = 0; g < c_.n_group; ++g) {
        std::vector<double> members(choice.begin() + g * per_group,
                                    choice.begin() + (g + 1) * per_group);
        std::sort(members.rbegin(), members.rend());
        group_scores[g] =
            c_.topk_method == TopkMethod::kNoAuxTc ? members[0] + members[1] : members[0];
      }
      const std::vector<int> keep = top_indices(group_scores, static_cast<int>(c_.topk_group));
      for (int64_t e = 0; e < n_exp; ++e) {
        if (std::find(keep.begin(), keep.end(), e / per_group) == keep.end()) choice[e] = -INFINITY;
      }
    }
    const std::vector<int> chosen = top_indices(choice, static_cast<int>(top_k));
    std::vector<double> w(top_k);
    double sum = 0;
    for (int64_t k = 0; k < top_k; ++k) sum += w[k] = scores[chosen[k]];
    const bool normalise = top_k > 1 && c_.norm_topk_prob;
    for (int64_t k = 0; k < top_k; ++k) {
      if (normalise) w[k] /= sum + 1e-20;
      if (c_.arch == ModelArch::kDeepseekV3 || !normalise) w[k] *= c_.routed_scaling_factor;
      const Matrix y = mlp({x[t]}, p + "experts." + std::to_string(chosen[k]) + ".");
      for (size_t d = 0; d < y[0].size(); ++d) out[t][d] += w[k] * y[0][d];
    }
  }
  return out;
}

Matrix ReferenceModel::decoder_layer(const Matrix& x_in, int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  Matrix x = x_in;
  const Matrix a = attention(rmsnorm(x, p + "input_layernorm.weight"), p + "self_attn.");
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t d = 0; d < x[i].size(); ++d) x[i][d] += a[i][d];
  }
  const Matrix h = rmsnorm(x, p + "post_attention_layernorm.weight");
  const bool is_moe = layer >= c_.first_k_dense_replace && layer % c_.moe_layer_freq == 0;
  const Matrix m = is_moe ? moe(h, p + "mlp.") : mlp(h, p + "mlp.");
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t d = 0; d < x[i].size(); ++d) x[i][d] += m[i][d];
  }
  return x;
}

Matrix ReferenceModel::forward(const std::vector<int32_t>& tokens, Matrix* final_hidden) {
  const Matrix& embed = weight("model.embed_tokens.weight");
  Matrix x;
  for (int32_t t : tokens) x.push_back(embed[t]);
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) x = decoder_layer(x, l);
  x = rmsnorm(x, "model.norm.weight");
  if (final_hidden) *final_hidden = x;
  return linear(x, "lm_head.weight");
}

Matrix ReferenceModel::forward_mtp(const std::vector<int32_t>& next_tokens, const Matrix& hidden) {
  const std::string p = "model.layers." + std::to_string(c_.num_hidden_layers) + ".";
  const Matrix& embed = weight(p + "embed_tokens.weight");
  Matrix e;
  for (int32_t t : next_tokens) e.push_back(embed[t]);
  e = rmsnorm(e, p + "enorm.weight");
  const Matrix h = rmsnorm(hidden, p + "hnorm.weight");
  Matrix cat(e.size());
  for (size_t i = 0; i < e.size(); ++i) {
    cat[i] = e[i];
    cat[i].insert(cat[i].end(), h[i].begin(), h[i].end());
  }
  Matrix x = decoder_layer(linear(cat, p + "eh_proj.weight"), c_.num_hidden_layers);
  return linear(rmsnorm(x, p + "shared_head.norm.weight"), p + "shared_head.head.weight");
}

}  // namespace peerserve::testing
