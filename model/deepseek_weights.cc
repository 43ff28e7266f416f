#include "model/deepseek_weights.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <optional>
#include <thread>

#include <string>
#include <string_view>
#include <utility>

#include "base/thread_pool.h"
#include "kernels/vector_ops.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/tensor_layout.h"

namespace peerserve {
namespace {

class WeightReader {
 public:
  explicit WeightReader(Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  // A BF16 matrix (I8 and FP8 weights dequantized): for weights not used as one GEMM.
  Result<LinearWeight> matrix(const std::string& name, int64_t rows, int64_t cols) {
    PS_ASSIGN_OR_RETURN(WeightTensor t, checkpoint_.get_bf16(name, {rows, cols}));
    return LinearWeight{t.bf16_data(), rows, cols, std::move(t.storage), nullptr, nullptr, nullptr};
  }
  // A GEMM weight: stored I8, it is packed for the INT8 kernels as is (no BF16 form).
  Result<LinearWeight> gemm_weight(const std::string& name, int64_t rows, int64_t cols) {
    if (!is_int8(name)) return matrix(name, rows, cols);
    PS_ASSIGN_OR_RETURN(Int8WeightTensor t, checkpoint_.get_int8(name, {rows, cols}));
    auto packed = kernels::PackedInt8Matrix::pack(int8_view(t));
    if (!packed.ok())
      return packed.status().with_context(checkpoint_.dir() + ": tensor '" + name + "'");
    LinearWeight w{nullptr, rows, cols, nullptr, nullptr, nullptr, nullptr};
    w.int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
    if (!t.compensation.empty()) {
      w.int8_compensation = std::make_shared<const std::vector<float>>(std::move(t.compensation));
    }
    checkpoint_.release_pages(name);  // the packed copy is what the kernels read
    return w;
  }
  bool is_int8(const std::string& name) const {
    const Result<CheckpointTensorInfo> info = checkpoint_.info(name);
    return info.ok() && info->dtype == DType::kI8;
  }
  Result<Int8WeightTensor> int8(const std::string& name, int64_t rows, int64_t cols) {
    return checkpoint_.get_int8(name, {rows, cols});
  }
  void release(const std::string& name) { checkpoint_.release_pages(name); }
  static kernels::Int8WeightsView int8_view(const Int8WeightTensor& t) {
    return {{t.values, t.rows, t.cols, 0}, t.scales.data()};
  }
  Result<std::vector<float>> vector(const std::string& name, int64_t size) {
    return checkpoint_.get_f32(name, {size});
  }
  Result<std::vector<float>> f32_matrix(const std::string& name, int64_t rows, int64_t cols) {
    return checkpoint_.get_f32(name, {rows, cols});
  }

 private:
  Checkpoint& checkpoint_;
};

Result<MlpWeights> load_mlp(WeightReader& r, const std::string& prefix, int64_t hidden,
                            int64_t inter) {
  MlpWeights w;
  const std::string gate = prefix + "gate_proj.weight", up = prefix + "up_proj.weight";
  const std::string down = prefix + "down_proj.weight";
  // The MLP kernels run one precision per MLP (fused INT8 gate/up/SiLU, or BF16 products).
  const bool gate_int8 = r.is_int8(gate), up_int8 = r.is_int8(up), down_int8 = r.is_int8(down);
  if (gate_int8 != up_int8 || up_int8 != down_int8) {
    auto kind = [](bool int8) { return int8 ? "I8" : "not I8"; };
    return invalid_argument(prefix +
                            "{gate,up,down}_proj.weight: an MLP's three projections must "
                            "all be stored I8 or none (gate " +
                            kind(gate_int8) + ", up " + kind(up_int8) + ", down " +
                            kind(down_int8) + ")");
  }
  if (gate_int8) {
    // Stored INT8: only the fused gate/up form the kernels read is built.
    PS_ASSIGN_OR_RETURN(Int8WeightTensor g, r.int8(gate, inter, hidden));
    PS_ASSIGN_OR_RETURN(Int8WeightTensor u, r.int8(up, inter, hidden));
    if (!g.compensation.empty() || !u.compensation.empty()) {
      // It would have to enter before the fused SiLU (kernels/matmul_int8.h).
      return unimplemented(gate + " / " + up +
                           ": an error compensation on gate/up projections is not supported");
    }
    auto packed = kernels::PackedInt8Matrix::pack_gate_up(WeightReader::int8_view(g),
                                                          WeightReader::int8_view(u));
    if (!packed.ok()) return packed.status().with_context(gate + " / " + up);
    w.gate_up_int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
    r.release(gate);
    r.release(up);
    w.gate = LinearWeight{nullptr, inter, hidden, nullptr, nullptr, nullptr, nullptr};
    w.up = LinearWeight{nullptr, inter, hidden, nullptr, nullptr, nullptr, nullptr};
  } else {
    PS_ASSIGN_OR_RETURN(w.gate, r.gemm_weight(gate, inter, hidden));
    PS_ASSIGN_OR_RETURN(w.up, r.gemm_weight(up, inter, hidden));
  }
  PS_ASSIGN_OR_RETURN(w.down, r.gemm_weight(down, hidden, inter));
  return w;
}

Result<AttentionWeights> load_attention(WeightReader& r, const ModelConfig& c,
                                        const std::string& prefix) {
  const int64_t heads = c.num_attention_heads, hidden = c.hidden_size;
  const int64_t nope = c.qk_nope_head_dim, v = c.v_head_dim, lora = c.kv_lora_rank;
  AttentionWeights w;
  if (c.q_lora_rank) {
    const int64_t q_lora = *c.q_lora_rank;
    PS_ASSIGN_OR_RETURN(w.q_a, r.gemm_weight(prefix + "q_a_proj.weight", q_lora, hidden));
    PS_ASSIGN_OR_RETURN(w.q_a_norm, r.vector(prefix + "q_a_layernorm.weight", q_lora));
    PS_ASSIGN_OR_RETURN(w.q_b,
                        r.gemm_weight(prefix + "q_b_proj.weight", heads * c.qk_head_dim(), q_lora));
  } else {
    PS_ASSIGN_OR_RETURN(w.q_proj,
                        r.gemm_weight(prefix + "q_proj.weight", heads * c.qk_head_dim(), hidden));
  }
  PS_ASSIGN_OR_RETURN(w.kv_a, r.gemm_weight(prefix + "kv_a_proj_with_mqa.weight",
                                            lora + c.qk_rope_head_dim, hidden));
  PS_ASSIGN_OR_RETURN(w.kv_a_norm, r.vector(prefix + "kv_a_layernorm.weight", lora));
  PS_ASSIGN_OR_RETURN(w.kv_b, r.matrix(prefix + "kv_b_proj.weight", heads * (nope + v), lora));
  PS_ASSIGN_OR_RETURN(w.o_proj, r.gemm_weight(prefix + "o_proj.weight", hidden, heads * v));

  // W_UK per head, transposed so that q_nope W_UK becomes an ordinary x w^T product.
  w.w_uk_t.resize(static_cast<size_t>(heads * lora * nope));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t d = 0; d < nope; ++d) {
      const bf16* row = w.kv_b.data + (h * (nope + v) + d) * lora;
      for (int64_t col = 0; col < lora; ++col) w.w_uk_t[(h * lora + col) * nope + d] = row[col];
    }
  }
  return w;
}

std::string expert_prefix(int64_t layer, int64_t expert) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + ".";
}

Result<DecoderLayerWeights> load_layer(WeightReader& r, const ModelConfig& c, int64_t index,
                                       const RoutedExpertSelector& select) {
  const std::string prefix = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size;
  DecoderLayerWeights w;
  w.index = index;
  PS_ASSIGN_OR_RETURN(w.input_norm, r.vector(prefix + "input_layernorm.weight", hidden));
  PS_ASSIGN_OR_RETURN(w.post_attention_norm,
                      r.vector(prefix + "post_attention_layernorm.weight", hidden));
  PS_ASSIGN_OR_RETURN(w.attention, load_attention(r, c, prefix + "self_attn."));
  if (!c.is_moe_layer(index)) {
    PS_ASSIGN_OR_RETURN(w.dense_mlp, load_mlp(r, prefix + "mlp.", hidden, c.intermediate_size));
    return w;
  }
  MoeWeights moe;
  const int64_t n = c.n_routed_experts;
  PS_ASSIGN_OR_RETURN(moe.router, r.f32_matrix(prefix + "mlp.gate.weight", n, hidden));
  if (c.topk_method == TopkMethod::kNoAuxTc) {
    PS_ASSIGN_OR_RETURN(moe.bias, r.vector(prefix + "mlp.gate.e_score_correction_bias", n));
  }
  if (select) {
    moe.expert_ids = select(index);
  } else {
    moe.expert_ids.resize(n);
    for (int64_t e = 0; e < n; ++e) moe.expert_ids[e] = static_cast<int32_t>(e);
  }
  moe.experts.reserve(moe.expert_ids.size());
  for (const int32_t e : moe.expert_ids) {
    if (e < 0 || e >= n) {
      return invalid_argument("layer " + std::to_string(index) + ": routed expert " +
                              std::to_string(e) + " selected for loading is outside [0, " +
                              std::to_string(n) + ")");
    }
    PS_ASSIGN_OR_RETURN(MlpWeights expert,
                        load_mlp(r, expert_prefix(index, e), hidden, c.moe_intermediate_size));
    // A layer's routed experts run as one grouped call of one precision.
    if (!moe.experts.empty() &&
        (expert.gate_up_int8 != nullptr) != (moe.experts.front().gate_up_int8 != nullptr)) {
      return invalid_argument("layer " + std::to_string(index) + ": routed expert " +
                              std::to_string(e) + " is " + (expert.gate_up_int8 ? "" : "not ") +
                              "stored I8 and expert " + std::to_string(moe.expert_ids.front()) +
                              " is " + (moe.experts.front().gate_up_int8 ? "" : "not ") +
                              "(a layer's routed experts must all be I8 or none)");
    }
    moe.experts.push_back(std::move(expert));
  }
  if (c.n_shared_experts > 0) {
    PS_ASSIGN_OR_RETURN(moe.shared, load_mlp(r, prefix + "mlp.shared_experts.", hidden,
                                             c.moe_intermediate_size * c.n_shared_experts));
  }
  w.moe = std::move(moe);
  return w;
}

Result<MtpWeights> load_mtp(WeightReader& r, const ModelConfig& c, int64_t index,
                            const RoutedExpertSelector& select) {
  const std::string prefix = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  MtpWeights w;
  PS_ASSIGN_OR_RETURN(w.embed, r.matrix(prefix + "embed_tokens.weight", vocab, hidden));
  PS_ASSIGN_OR_RETURN(w.enorm, r.vector(prefix + "enorm.weight", hidden));
  PS_ASSIGN_OR_RETURN(w.hnorm, r.vector(prefix + "hnorm.weight", hidden));
  PS_ASSIGN_OR_RETURN(w.eh_proj, r.gemm_weight(prefix + "eh_proj.weight", hidden, 2 * hidden));
  PS_ASSIGN_OR_RETURN(w.layer, load_layer(r, c, index, select));
  PS_ASSIGN_OR_RETURN(w.head_norm, r.vector(prefix + "shared_head.norm.weight", hidden));
  PS_ASSIGN_OR_RETURN(w.head, r.gemm_weight(prefix + "shared_head.head.weight", vocab, hidden));
  return w;
}

}  // namespace

Result<MlpWeights> load_routed_expert(Checkpoint& checkpoint, int64_t layer, int64_t expert) {
  const ModelConfig& c = checkpoint.config();
  if (layer < 0 || layer >= c.num_hidden_layers + c.num_nextn_predict_layers ||
      !c.is_moe_layer(layer) || expert < 0 || expert >= c.n_routed_experts) {
    return invalid_argument("no routed expert " + std::to_string(expert) + " in layer " +
                            std::to_string(layer));
  }
  WeightReader r(checkpoint);
  return load_mlp(r, expert_prefix(layer, expert), c.hidden_size, c.moe_intermediate_size);
}

namespace {

// "model.layers.L.mlp.experts.E.<rest>" of an expert this model has: L an MoE layer (MTP
// layers included), E below n_routed_experts. Another rank may hold it; anything else that
// looks like one (an id past the experts, experts in a dense layer) is a stray tensor.
bool is_routed_expert_tensor(const ModelConfig& c, std::string_view name) {
  constexpr std::string_view kLayers = "model.layers.", kExperts = ".mlp.experts.";
  if (!name.starts_with(kLayers)) return false;
  name.remove_prefix(kLayers.size());
  auto number = [&name](int64_t* out) {
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), *out);
    if (error != std::errc() || end == name.data()) return false;
    name.remove_prefix(static_cast<size_t>(end - name.data()));
    return true;
  };
  int64_t layer = -1, expert = -1;
  if (!number(&layer) || !name.starts_with(kExperts)) return false;
  name.remove_prefix(kExperts.size());
  if (!number(&expert) || !name.starts_with(".") || name.size() < 2) return false;
  return layer >= 0 && layer < c.num_hidden_layers + c.num_nextn_predict_layers &&
         c.is_moe_layer(layer) && expert >= 0 && expert < c.n_routed_experts;
}

bool same_values(const LinearWeight& a, const LinearWeight& b) {
  // INT8 forms are not compared (an INT8 head and embedding are never the same weight).
  return a.data != nullptr && b.data != nullptr && a.rows == b.rows && a.cols == b.cols &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.rows * a.cols) * sizeof(bf16)) == 0;
}

// Two I8 weights stored with the same values and scales (compared in the mapping).
bool same_int8_stored(Checkpoint& checkpoint, const std::string& a, const std::string& b) {
  const auto bytes_equal = [&](const std::string& x, const std::string& y) {
    const Result<CheckpointTensorInfo> ix = checkpoint.info(x), iy = checkpoint.info(y);
    if (!ix.ok() || !iy.ok() || ix->dtype != iy->dtype || ix->shape != iy->shape) return false;
    const Result<WeightTensor> tx = checkpoint.get_raw(x), ty = checkpoint.get_raw(y);
    return tx.ok() && ty.ok() && std::memcmp(tx->data, ty->data, tx->nbytes()) == 0;
  };
  const auto same_compensation = [&] {
    const std::string ca = int8_compensation_name(a), cb = int8_compensation_name(b);
    const bool has_a = checkpoint.info(ca).ok(), has_b = checkpoint.info(cb).ok();
    return has_a == has_b && (!has_a || bytes_equal(ca, cb));
  };
  const Result<CheckpointTensorInfo> info = checkpoint.info(a);
  return info.ok() && info->dtype == DType::kI8 && bytes_equal(a, b) &&
         bytes_equal(int8_scale_name(a), int8_scale_name(b)) && same_compensation();
}

}  // namespace

void drop_bf16_form(LinearWeight& w) {
  w.data = nullptr;
  w.storage.reset();
}

void add_int8_compensation(const LinearWeight& w, int64_t m, float* y, int64_t y_stride) {
  if (!w.int8_compensation) return;
  const float* b = w.int8_compensation->data();
  const int64_t n = static_cast<int64_t>(w.int8_compensation->size());
  if (y_stride == 0) y_stride = n;
  // axpy with alpha 1 is exact in the multiply: each element is y + b, rounded once.
  for (int64_t i = 0; i < m; ++i) kernels::axpy(1.0f, b, y + i * y_stride, n);
}

Result<DeepseekWeights> load_deepseek_weights(Checkpoint& checkpoint, bool load_mtp_layer,
                                              const RoutedExpertSelector& select) {
  const ModelConfig& c = checkpoint.config();
  WeightReader r(checkpoint);
  DeepseekWeights w;
  PS_ASSIGN_OR_RETURN(w.embed, r.matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
  // Layers on several threads: reading a checkpoint is thread-safe, and converting or
  // repacking weights (FP8, INT8) is CPU work that one thread makes the load's bottleneck.
  std::vector<std::optional<DecoderLayerWeights>> layers(static_cast<size_t>(c.num_hidden_layers));
  std::vector<Status> errors(layers.size());
  std::atomic<int64_t> next{0};
  {
    const int64_t workers = std::clamp<int64_t>(available_cpus(), 1, 8);
    std::vector<std::jthread> threads;
    for (int64_t t = 0; t < std::min(workers, c.num_hidden_layers); ++t) {
      threads.emplace_back([&] {
        WeightReader reader(checkpoint);
        for (int64_t i = next++; i < c.num_hidden_layers; i = next++) {
          Result<DecoderLayerWeights> layer = load_layer(reader, c, i, select);
          if (layer.ok()) {
            layers[i] = std::move(layer).value();
          } else {
            errors[i] = layer.status();
          }
        }
      });
    }
  }
  w.layers.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!errors[i].ok()) return errors[i];  // the first layer's error, as a sequential load
    w.layers.push_back(std::move(*layers[i]));
  }
  PS_ASSIGN_OR_RETURN(w.final_norm, r.vector("model.norm.weight", c.hidden_size));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    PS_ASSIGN_OR_RETURN(w.lm_head, r.gemm_weight("lm_head.weight", c.vocab_size, c.hidden_size));
  }
  // Only the first MTP layer is used (DeepSeek-V3 ships one).
  if (load_mtp_layer && c.num_nextn_predict_layers > 0) {
    PS_ASSIGN_OR_RETURN(w.mtp, load_mtp(r, c, c.num_hidden_layers, select));
    // DeepSeek's checkpoints store the MTP layer's embedding and head as copies of the main
    // model's (shared in training): keep one, so a speculative step reads (and caches) one.
    if (same_values(w.mtp->embed, w.embed)) w.mtp->embed = w.embed;
    const std::string mtp_head =
        "model.layers." + std::to_string(c.num_hidden_layers) + ".shared_head.head.weight";
    if (same_values(w.mtp->head, w.lm_head) ||
        (!c.tie_word_embeddings && same_int8_stored(checkpoint, mtp_head, "lm_head.weight"))) {
      w.mtp->head = w.lm_head;
    }
  }

  // Every stored tensor must have been read, except MTP layers we chose not to load and
  // routed experts left to other processes.
  const int64_t first_skipped_mtp = c.num_hidden_layers + (w.mtp ? 1 : 0);
  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.unused_tensors()) {
    bool skipped_mtp = false;
    for (int64_t i = first_skipped_mtp; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) {
      if (name.starts_with("model.layers." + std::to_string(i) + ".")) skipped_mtp = true;
    }
    const bool other_expert = select && is_routed_expert_tensor(c, name);
    if (!skipped_mtp && !other_expert) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 5) list += ", ...";
    return invalid_argument(checkpoint.dir() + ": " + std::to_string(unexpected.size()) +
                            " tensor(s) the model does not use: " + list);
  }
  return w;
}

}  // namespace peerserve
