#include "model/int8_calibration.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>

#include "base/thread_pool.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/deepseek_model.h"
#include "model/forward_step.h"

namespace peerserve {
namespace {

// Per-input-channel absmax and a reservoir sample of input rows.
struct InputStats {
  int64_t cols = 0;
  std::vector<float> absmax;
  std::vector<float> rows;  // [kept, cols]
  int64_t kept = 0;
  int64_t seen = 0;
};

class Recorder final : public LinearInputRecorder {
 public:
  explicit Recorder(int64_t max_rows) : max_rows_(max_rows) {}

  void record(const bf16* weight, const float* x, int64_t m, int64_t cols,
              int64_t stride) override {
    std::lock_guard<std::mutex> lock(mu_);
    add(by_weight_[weight], x, m, cols, stride);
  }
  void record_moe_input(int64_t layer, const float* x, int64_t m, int64_t cols) override {
    std::lock_guard<std::mutex> lock(mu_);
    add(moe_[layer], x, m, cols, 0);
  }

  const InputStats* of(const void* weight) const {
    auto it = by_weight_.find(static_cast<const bf16*>(weight));
    return it == by_weight_.end() ? nullptr : &it->second;
  }
  const InputStats* moe(int64_t layer) const {
    auto it = moe_.find(layer);
    return it == moe_.end() ? nullptr : &it->second;
  }

 private:
  uint64_t next_random() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  }
  void add(InputStats& s, const float* x, int64_t m, int64_t cols, int64_t stride) {
    if (stride == 0) stride = cols;
    if (s.cols == 0) {
      s.cols = cols;
      s.absmax.assign(cols, 0.0f);
    }
    if (s.cols != cols) return;  // not a linear input we know
    for (int64_t i = 0; i < m; ++i) {
      const float* row = x + i * stride;
      for (int64_t c = 0; c < cols; ++c) s.absmax[c] = std::max(s.absmax[c], std::fabs(row[c]));
      ++s.seen;
      int64_t slot = -1;
      if (s.kept < max_rows_) {
        slot = s.kept++;
        s.rows.resize(s.kept * cols);
      } else {
        const int64_t j = static_cast<int64_t>(next_random() % static_cast<uint64_t>(s.seen));
        if (j < max_rows_) slot = j;
      }
      if (slot >= 0) std::copy(row, row + cols, s.rows.begin() + slot * cols);
    }
  }

  int64_t max_rows_;
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
  std::mutex mu_;
  std::map<const bf16*, InputStats> by_weight_;
  std::map<int64_t, InputStats> moe_;
};

float dot(const float* a, const float* b, int64_t k) {
  float acc[8] = {};
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[c + l] * b[c + l];
  }
  float s = 0;
  for (; c < k; ++c) s += a[c] * b[c];
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

// Dequantized Q(w * s) row by row (ratio per row, or 1).
void fake_quantize_rows(const float* w, int64_t rows, int64_t cols, const float* s,
                        const float* ratio, float* out) {
  std::vector<float> scaled(cols);
  std::vector<int8_t> q(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = w + r * cols;
    for (int64_t c = 0; c < cols; ++c) scaled[c] = s != nullptr ? src[c] * s[c] : src[c];
    const float scale =
        kernels::quantize_int8_row_clipped(scaled, ratio != nullptr ? ratio[r] : 1.0f, q);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = q[c] * scale;
  }
}

// A linear weight of a group with its sampled inputs.
struct Member {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> w;           // [rows, cols]
  const InputStats* x = nullptr;  // may be null (never saw a token)
  std::vector<float> reference;   // [kept, rows] = X W^T
  std::vector<float> xq;          // Qa(X / s), dequantized, for the chosen s
  int64_t n() const { return x != nullptr ? x->kept : 0; }
};

void compute_reference(Member& m) {
  const int64_t n = m.n();
  m.reference.assign(n * m.rows, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m.rows; ++r) {
      m.reference[i * m.rows + r] =
          dot(m.x->rows.data() + i * m.cols, m.w.data() + r * m.cols, m.cols);
    }
  }
}

// Qa(X / s), dequantized (per token, absmax / 127, as the kernels).
std::vector<float> fake_quantize_input(const Member& m, const float* s) {
  const int64_t n = m.n();
  std::vector<float> out(n * m.cols), row(m.cols);
  std::vector<int8_t> q(m.cols);
  for (int64_t i = 0; i < n; ++i) {
    const float* x = m.x->rows.data() + i * m.cols;
    for (int64_t c = 0; c < m.cols; ++c) row[c] = s != nullptr ? x[c] / s[c] : x[c];
    const float scale = kernels::quantize_int8_row(row, q);
    for (int64_t c = 0; c < m.cols; ++c) out[i * m.cols + c] = q[c] * scale;
  }
  return out;
}

// Squared error of output row r: sum_i (xq_i . wq - ref[i, r])^2.
double row_error(const Member& m, const std::vector<float>& xq, const float* wq, int64_t r) {
  double e = 0;
  for (int64_t i = 0; i < m.n(); ++i) {
    const double d = double{dot(xq.data() + i * m.cols, wq, m.cols)} - m.reference[i * m.rows + r];
    e += d * d;
  }
  return e;
}

double member_error(const Member& m, const float* s, ThreadPool& pool) {
  if (m.n() == 0) return 0;
  const std::vector<float> xq = fake_quantize_input(m, s);
  std::vector<float> wq(m.rows * m.cols);
  std::vector<double> errors(m.rows, 0.0);
  pool.parallel_for(m.rows, [&](int64_t begin, int64_t end) {
    fake_quantize_rows(m.w.data() + begin * m.cols, end - begin, m.cols, s, nullptr,
                       wq.data() + begin * m.cols);
    for (int64_t r = begin; r < end; ++r) errors[r] = row_error(m, xq, wq.data() + r * m.cols, r);
  });
  double e = 0;
  for (double v : errors) e += v;
  return e;
}

double group_error(const std::vector<Member>& members, const float* s, ThreadPool& pool) {
  double e = 0;
  for (const Member& m : members) e += member_error(m, s, pool);
  return e;
}

// s_j = max|X_j|^a / max|W_:,j|^(1-a), rounded to a power of two (exact transform), and
// normalized so that the geometric mean is about 1.
std::vector<float> smoothing_scales(const std::vector<float>& xabs, const std::vector<float>& wabs,
                                    float alpha) {
  const int64_t k = static_cast<int64_t>(xabs.size());
  std::vector<double> log2s(k, 0.0);
  double sum = 0;
  int64_t counted = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (xabs[j] > 0 && wabs[j] > 0) {
      log2s[j] = alpha * std::log2(double{xabs[j]}) - (1 - alpha) * std::log2(double{wabs[j]});
      sum += log2s[j];
      ++counted;
    }
  }
  const double shift = counted > 0 ? std::round(sum / counted) : 0.0;
  std::vector<float> s(k, 1.0f);
  for (int64_t j = 0; j < k; ++j) {
    if (xabs[j] > 0 && wabs[j] > 0) {
      const double e = std::clamp(std::round(log2s[j] - shift), -24.0, 24.0);
      s[j] = static_cast<float>(std::exp2(e));
    }
  }
  return s;
}

constexpr float kClipRatios[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f};

// Chooses each row's clipping ratio on the sample (given s); returns the summed error.
double choose_clipping(const Member& m, const float* s, std::vector<float>* ratios,
                       ThreadPool& pool) {
  ratios->assign(m.rows, 1.0f);
  if (m.n() == 0) return 0;
  const std::vector<float> xq = fake_quantize_input(m, s);
  std::vector<double> errors(m.rows, 0.0);
  pool.parallel_for(m.rows, [&](int64_t begin, int64_t end) {
    std::vector<float> wq(m.cols);
    for (int64_t r = begin; r < end; ++r) {
      double best = -1;
      for (float ratio : kClipRatios) {
        fake_quantize_rows(m.w.data() + r * m.cols, 1, m.cols, s, &ratio, wq.data());
        const double e = row_error(m, xq, wq.data(), r);
        if (best < 0 || e < best) {
          best = e;
          (*ratios)[r] = ratio;
        }
      }
      errors[r] = best;
    }
  });
  double e = 0;
  for (double v : errors) e += v;
  return e;
}

// The error compensation of one weight (see the header), given its smoothing s and clipping
// ratios (either may be null). Sums the odd sample rows' squared error without and with the
// compensation estimated on the even rows into *before and *after; returns the compensation
// estimated on every row.
std::vector<float> estimate_compensation(const Member& m, const float* s,
                                         const std::vector<float>* ratios, double* before,
                                         double* after, ThreadPool& pool) {
  const int64_t n = m.n();
  std::vector<float> compensation(m.rows, 0.0f);
  std::vector<double> row_before(m.rows, 0.0), row_after(m.rows, 0.0);
  if (n < 2) return compensation;
  const std::vector<float> xq = fake_quantize_input(m, s);
  pool.parallel_for(m.rows, [&](int64_t begin, int64_t end) {
    std::vector<float> wq(m.cols);
    std::vector<double> d(n);
    for (int64_t r = begin; r < end; ++r) {
      fake_quantize_rows(m.w.data() + r * m.cols, 1, m.cols, s,
                         ratios != nullptr ? ratios->data() + r : nullptr, wq.data());
      double even = 0, all = 0;
      for (int64_t i = 0; i < n; ++i) {
        d[i] = m.reference[i * m.rows + r] - double{dot(xq.data() + i * m.cols, wq.data(), m.cols)};
        all += d[i];
        if (i % 2 == 0) even += d[i];
      }
      const double even_mean = even / static_cast<double>((n + 1) / 2);
      for (int64_t i = 1; i < n; i += 2) {
        row_before[r] += d[i] * d[i];
        row_after[r] += (d[i] - even_mean) * (d[i] - even_mean);
      }
      compensation[r] = static_cast<float>(all / static_cast<double>(n));
    }
  });
  for (int64_t r = 0; r < m.rows; ++r) {
    *before += row_before[r];
    *after += row_after[r];
  }
  return compensation;
}

struct GroupSpec {
  std::string name;    // the norm (without ".weight") or the weight
  std::string norm;    // norm weight name; empty: no smoothing (clip only)
  std::string router;  // router weight whose columns follow s; may be empty
  std::vector<std::pair<std::string, const InputStats*>> members;
  const InputStats* shared_input = nullptr;  // absmax source when set
};

GroupSpec make_group(std::string name, std::string norm) {
  GroupSpec g;
  g.name = std::move(name);
  g.norm = std::move(norm);
  return g;
}

}  // namespace

Result<Int8PipelineOptions> parse_int8_pipeline(const std::string& name) {
  Int8PipelineOptions o;
  if (name == "rtn") return o;
  for (size_t begin = 0; begin <= name.size();) {
    const size_t end = std::min(name.find('+', begin), name.size());
    const std::string step = name.substr(begin, end - begin);
    if (step == "smooth") {
      o.smooth = true;
    } else if (step == "search") {
      o.scale_search = true;
    } else if (step == "clip") {
      o.clip = true;
    } else if (step == "compensate") {
      o.compensate = true;
    } else if (step == "full") {
      o.scale_search = o.clip = true;
    } else {
      return invalid_argument("unknown --pipeline '" + name + "'" +
                              (step.empty() ? "" : " (step '" + step + "')") +
                              ": rtn, or steps joined by '+': smooth, search, clip, compensate, "
                              "full (= search+clip); e.g. full+compensate");
    }
    begin = end + 1;
  }
  return o;
}

Result<Int8Transforms> calibrate_int8(const std::string& checkpoint_dir,
                                      std::span<const int32_t> tokens, int32_t bos_id,
                                      const CalibrationOptions& options) {
  if (options.window < 2) return invalid_argument("calibration window must be >= 2 tokens");
  if (tokens.empty()) return invalid_argument("no calibration tokens");
  PS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(checkpoint_dir));
  const ModelConfig config = checkpoint.config();
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(config);
  for (const TensorSpec& spec : layout) {
    if (spec.role != TensorRole::kLinear && spec.role != TensorRole::kOutputHead) continue;
    PS_ASSIGN_OR_RETURN(CheckpointTensorInfo info, checkpoint.info(spec.name));
    if (info.dtype != DType::kBF16) {
      return invalid_argument(checkpoint_dir + ": calibration needs a BF16 checkpoint; '" +
                              spec.name + "' is " + std::string(dtype_name(info.dtype)));
    }
  }
  ModelOptions model_options;
  model_options.num_threads = options.num_threads;
  model_options.load_mtp = false;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model,
                      DeepseekModel::from_checkpoint(checkpoint, model_options));

  // Run the calibration windows with the recorder on.
  Recorder recorder(options.max_sample_rows);
  set_linear_input_recorder(&recorder);
  const int64_t per_window = options.window - 1;
  Int8Transforms result;
  Status status = ok_status();
  for (size_t begin = 0; begin < tokens.size() && status.ok(); begin += per_window) {
    std::vector<int32_t> window = {bos_id};
    const size_t end = std::min(tokens.size(), begin + per_window);
    window.insert(window.end(), tokens.begin() + begin, tokens.begin() + end);
    const KvLayout kv = model->kv_layout(16, DType::kBF16);
    Result<LatentKvCache> cache = LatentKvCache::create(kv, kv.blocks_for_tokens(window.size()));
    if (!cache.ok()) {
      status = cache.status();
      break;
    }
    std::vector<int32_t> blocks(cache->num_blocks());
    for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
    SequenceChunk chunk;
    chunk.tokens = window;
    chunk.block_table = blocks;
    chunk.all_logits = true;  // the head's input for every row
    ForwardOutput out;
    status = model->forward({&chunk, 1}, *cache, &out);
    result.tokens += static_cast<int64_t>(window.size());
  }
  set_linear_input_recorder(nullptr);
  PS_RETURN_IF_ERROR(status);

  // The weights' identities: their BF16 views (the model's, from the same mapping).
  auto stats_of = [&](const std::string& name) -> const InputStats* {
    for (const TensorSpec& spec : layout) {
      if (spec.name != name) continue;
      Result<WeightTensor> t = checkpoint.get_bf16(spec.name, spec.shape);
      return t.ok() ? recorder.of(t->bf16_data()) : nullptr;
    }
    return nullptr;
  };

  // The groups.
  std::vector<GroupSpec> groups;
  std::vector<std::string> singles;  // clipping only
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    GroupSpec attn = make_group(p + "input_layernorm", p + "input_layernorm.weight");
    const std::string first =
        config.q_lora_rank > 0 ? p + "self_attn.q_a_proj.weight" : p + "self_attn.q_proj.weight";
    attn.members.push_back({first, stats_of(first)});
    const std::string kv_a = p + "self_attn.kv_a_proj_with_mqa.weight";
    attn.members.push_back({kv_a, stats_of(kv_a)});
    groups.push_back(attn);
    if (config.q_lora_rank > 0) {
      GroupSpec qb =
          make_group(p + "self_attn.q_a_layernorm", p + "self_attn.q_a_layernorm.weight");
      const std::string name = p + "self_attn.q_b_proj.weight";
      qb.members.push_back({name, stats_of(name)});
      groups.push_back(qb);
    }
    singles.push_back(p + "self_attn.o_proj.weight");
    GroupSpec mlp =
        make_group(p + "post_attention_layernorm", p + "post_attention_layernorm.weight");
    if (config.is_moe_layer(l)) {
      mlp.router = p + "mlp.gate.weight";
      mlp.shared_input = recorder.moe(l);
      for (int64_t e = 0; e < config.n_routed_experts; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        const InputStats* x = stats_of(ep + "gate_proj.weight");
        mlp.members.push_back({ep + "gate_proj.weight", x});
        mlp.members.push_back({ep + "up_proj.weight", x});
        singles.push_back(ep + "down_proj.weight");
      }
      if (config.n_shared_experts > 0) {
        const std::string sp = p + "mlp.shared_experts.";
        mlp.members.push_back({sp + "gate_proj.weight", mlp.shared_input});
        mlp.members.push_back({sp + "up_proj.weight", mlp.shared_input});
        singles.push_back(sp + "down_proj.weight");
      }
    } else {
      // Dense: gate/up's BF16 product has no recording hook; not calibrated.
      singles.push_back(p + "mlp.down_proj.weight");
    }
    if (!mlp.members.empty()) groups.push_back(mlp);
  }
  // The final norm's output is also the MTP layer's input (its hnorm re-normalizes it, so a
  // per-channel 1/s there cannot be absorbed): with an MTP layer the head is not smoothed.
  if (options.lm_head && !config.tie_word_embeddings && config.num_nextn_predict_layers == 0) {
    GroupSpec head = make_group("model.norm", "model.norm.weight");
    head.members.push_back({"lm_head.weight", stats_of("lm_head.weight")});
    groups.push_back(head);
  }
  for (const std::string& name : singles) {
    GroupSpec g = make_group(name, "");
    g.members.push_back({name, stats_of(name)});
    groups.push_back(std::move(g));
  }

  ThreadPool pool(options.num_threads);
  std::vector<float> alphas;
  if (options.pipeline.scale_search) {
    for (int i = 0; i <= 10; ++i) alphas.push_back(0.1f * i);
  } else if (options.pipeline.smooth) {
    alphas.push_back(0.5f);
  }
  const bool smoothing = !alphas.empty();
  for (const GroupSpec& g : groups) {
    if (g.norm.empty() && !options.pipeline.clip && !options.pipeline.compensate) continue;
    std::vector<Member> members;
    bool any_sample = false;
    for (const auto& [name, x] : g.members) {
      Member m;
      m.name = name;
      const TensorSpec* spec = nullptr;
      for (const TensorSpec& s : layout)
        if (s.name == name) spec = &s;
      if (spec == nullptr) return internal_error("no tensor " + name);
      m.rows = spec->shape[0];
      m.cols = spec->shape[1];
      PS_ASSIGN_OR_RETURN(m.w, checkpoint.get_f32(name, spec->shape));
      m.x = x != nullptr && x->cols == m.cols && x->kept > 0 ? x : nullptr;
      any_sample = any_sample || m.x != nullptr;
      compute_reference(m);
      members.push_back(std::move(m));
    }
    if (!any_sample) continue;  // never ran (e.g. dense gate/up): round to nearest
    CalibrationGroupReport report;
    report.name = g.name;
    report.weights = static_cast<int64_t>(members.size());
    for (const Member& m : members) {
      report.sample_rows += m.n();
      for (float v : m.reference) report.reference += double{v} * v;
    }
    report.rtn_error = group_error(members, nullptr, pool);
    report.smoothed_error = report.rtn_error;
    std::shared_ptr<std::vector<float>> chosen;
    if (smoothing && !g.norm.empty()) {
      const int64_t k = members[0].cols;
      std::vector<float> xabs(k, 0.0f), wabs(k, 0.0f);
      for (const Member& m : members) {
        const InputStats* x = g.shared_input != nullptr ? g.shared_input : m.x;
        if (x != nullptr && x->cols == k) {
          for (int64_t j = 0; j < k; ++j) xabs[j] = std::max(xabs[j], x->absmax[j]);
        }
        for (int64_t r = 0; r < m.rows; ++r) {
          for (int64_t j = 0; j < k; ++j) wabs[j] = std::max(wabs[j], std::fabs(m.w[r * k + j]));
        }
      }
      for (float alpha : alphas) {
        auto s = std::make_shared<std::vector<float>>(smoothing_scales(xabs, wabs, alpha));
        const double e = group_error(members, s->data(), pool);
        if (e < report.smoothed_error || (!options.guard && !chosen)) {
          report.smoothed_error = e;
          report.alpha = alpha;
          chosen = s;
        }
      }
    }
    report.error = report.smoothed_error;
    if (chosen) {
      result.norm_divisor[g.norm] = chosen;
      if (!g.router.empty()) result.column_scale[g.router] = chosen;
      for (const Member& m : members) result.column_scale[m.name] = chosen;
    }
    std::vector<std::vector<float>> member_ratios(members.size());
    if (options.pipeline.clip) {
      report.error = 0;
      double ratio_sum = 0;
      int64_t ratio_rows = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        const Member& m = members[i];
        std::vector<float>& ratios = member_ratios[i];
        report.error += choose_clipping(m, chosen ? chosen->data() : nullptr, &ratios, pool);
        if (m.n() == 0) continue;
        for (float r : ratios) ratio_sum += r;
        ratio_rows += m.rows;
        if (std::any_of(ratios.begin(), ratios.end(), [](float r) { return r != 1.0f; })) {
          result.row_clip[m.name] = ratios;
        }
      }
      report.mean_clip = ratio_rows > 0 ? ratio_sum / ratio_rows : 1.0;
    }
    if (options.pipeline.compensate) {
      for (size_t i = 0; i < members.size(); ++i) {
        const Member& m = members[i];
        if (m.name.ends_with("gate_proj.weight") || m.name.ends_with("up_proj.weight")) continue;
        double before = 0, after = 0;
        std::vector<float> compensation = estimate_compensation(
            m, chosen ? chosen->data() : nullptr,
            member_ratios[i].empty() ? nullptr : &member_ratios[i], &before, &after, pool);
        report.compensation_before += before;
        if (after < before) {
          report.compensation_after += after;
          ++report.compensated_weights;
          result.compensation[m.name] = std::move(compensation);
        } else {
          report.compensation_after += before;
        }
      }
    }
    result.groups.push_back(std::move(report));
  }
  return result;
}

}  // namespace peerserve
