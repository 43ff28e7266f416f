// The DeepSeek-V3 decoder, top to bottom: embeddings -> per layer [RMSNorm -> MLA ->
// residual -> RMSNorm -> dense MLP or MoE (routed experts via ExpertBackend + shared
// experts) -> residual] -> final RMSNorm -> LM head; and the MTP layer on top.
#include "model/deepseek_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include "base/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/bf16_convert.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/vector_ops.h"
#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_weights.h"
#include "model/forward_step.h"
#include "model/local_expert_backend.h"
#include "model/mla_attention.h"
#include "model/moe_router.h"
#include "model/rotary_embedding.h"

namespace peerserve {
namespace {

// What validation and planning need from a SequenceChunk or an MtpChunk.
struct ChunkView {
  std::span<const int32_t> tokens;
  int64_t start_pos = 0;
  std::span<const int32_t> block_table;
  bool all_logits = false;
};

std::string seq_label(const char* what, size_t i) {
  return std::string(what) + ": sequence " + std::to_string(i) + ": ";
}

}  // namespace

struct DeepseekModel::Impl {
  Impl(ModelConfig config_in, ModelOptions options_in, DeepseekWeights weights_in)
      : config(std::move(config_in)),
        options(std::move(options_in)),
        weights(std::move(weights_in)),
        pool(options.num_threads),
        rope(config),
        attention(config, rope) {
    ctx.pool = &pool;
    ctx.precision = options.gemm_precision == GemmPrecision::kFp32
                        ? kernels::ActivationPrecision::kFp32
                        : kernels::ActivationPrecision::kBf16;
    std::vector<std::span<const MlpWeights>> experts_by_layer(config.num_hidden_layers + 1);
    for (const DecoderLayerWeights& layer : weights.layers) {
      if (layer.moe) experts_by_layer[layer.index] = layer.moe->experts;
    }
    if (weights.mtp && weights.mtp->layer.moe) {
      experts_by_layer[config.num_hidden_layers] = weights.mtp->layer.moe->experts;
    }
    experts =
        std::make_shared<LocalExpertBackend>(std::move(experts_by_layer), ctx.precision, &pool);
  }

  Status validate(const char* what, std::span<const ChunkView> chunks, const LatentKvCache& cache,
                  int64_t kv_layers_needed) const;
  StepRows plan(std::span<const ChunkView> chunks) const;
  void embed(const Bf16Matrix& table, const StepRows& rows, std::span<const ChunkView> chunks,
             float* x) const;
  Status run_layer(const DecoderLayerWeights& w, int64_t kv_layer, const StepRows& rows,
                   LatentKvCache& cache);
  void run_mlp(const MlpWeights& w, const float* x, int64_t rows, float* out);
  Status run_moe(const DecoderLayerWeights& w, const float* x, int64_t rows, float* out);
  void finish(std::span<const ChunkView> chunks, const StepRows& rows,
              const std::vector<float>& norm, const Bf16Matrix& head, ForwardOutput* out);

  ModelConfig config;
  ModelOptions options;
  DeepseekWeights weights;
  ThreadPool pool;
  ComputeContext ctx;
  RotaryEmbedding rope;
  MlaAttention attention;
  std::shared_ptr<ExpertBackend> experts;
  // Step scratch, reused.
  std::vector<float> x_, x_norm_, branch_, gate_, up_, shared_, router_logits_, route_scratch_;
  std::vector<float> route_weights_, concat_;
  std::vector<int32_t> route_ids_;
};

Status DeepseekModel::Impl::validate(const char* what, std::span<const ChunkView> chunks,
                                     const LatentKvCache& cache, int64_t kv_layers_needed) const {
  const KvLayout& layout = cache.layout();
  if (layout.latent_dim != config.kv_lora_rank || layout.rope_dim != config.qk_rope_head_dim ||
      layout.num_layers < kv_layers_needed) {
    return invalid_argument(
        std::string(what) + ": KV cache layout (layers " + std::to_string(layout.num_layers) +
        ", latent " + std::to_string(layout.latent_dim) + ", rope " +
        std::to_string(layout.rope_dim) + ") does not fit the model: need " +
        std::to_string(kv_layers_needed) + " layers, latent " +
        std::to_string(config.kv_lora_rank) + ", rope " + std::to_string(config.qk_rope_head_dim));
  }
  std::unordered_map<int32_t, size_t> writer_of_block;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkView& chunk = chunks[i];
    const std::string label = seq_label(what, i);
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    if (n == 0) return invalid_argument(label + "no new tokens, expected at least one");
    for (int64_t t = 0; t < n; ++t) {
      if (chunk.tokens[t] < 0 || chunk.tokens[t] >= config.vocab_size) {
        return invalid_argument(label + "token id " + std::to_string(chunk.tokens[t]) +
                                " at index " + std::to_string(t) +
                                " is outside the vocabulary [0, " +
                                std::to_string(config.vocab_size) + ")");
      }
    }
    if (chunk.start_pos < 0) {
      return invalid_argument(label + "start_pos = " + std::to_string(chunk.start_pos) +
                              ", expected >= 0");
    }
    const int64_t end = chunk.start_pos + n;
    if (end > config.max_position_embeddings) {
      return out_of_range(label + "positions [" + std::to_string(chunk.start_pos) + ", " +
                          std::to_string(end) + ") go beyond max_position_embeddings = " +
                          std::to_string(config.max_position_embeddings));
    }
    const int64_t blocks_needed = layout.blocks_for_tokens(end);
    if (static_cast<int64_t>(chunk.block_table.size()) < blocks_needed) {
      return invalid_argument(label + "block table has " +
                              std::to_string(chunk.block_table.size()) +
                              " blocks, expected at least " + std::to_string(blocks_needed) +
                              " to cover positions [0, " + std::to_string(end) + ") with " +
                              std::to_string(layout.block_size) + " tokens per block");
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = chunk.block_table[b];
      if (id < 0 || id >= cache.num_blocks()) {
        return invalid_argument(label + "block id " + std::to_string(id) +
                                " at block table index " + std::to_string(b) +
                                " is outside the cache [0, " + std::to_string(cache.num_blocks()) +
                                ")");
      }
    }
    for (int64_t b = chunk.start_pos / layout.block_size; b < blocks_needed; ++b) {
      const auto [it, inserted] = writer_of_block.emplace(chunk.block_table[b], i);
      if (!inserted && it->second != i) {
        return invalid_argument(label + "block " + std::to_string(chunk.block_table[b]) +
                                " is also written by sequence " + std::to_string(it->second) +
                                " in the same step");
      }
    }
  }
  return ok_status();
}

StepRows DeepseekModel::Impl::plan(std::span<const ChunkView> chunks) const {
  StepRows rows;
  for (const ChunkView& c : chunks) {
    StepChunk step;
    step.row_begin = rows.num_rows;
    step.num_tokens = static_cast<int64_t>(c.tokens.size());
    step.start_pos = c.start_pos;
    step.block_table = c.block_table;
    step.absorbed =
        choose_absorbed_form(config, options.attention_form, step.num_tokens, step.context());
    rows.chunks.push_back(step);
    rows.num_rows += step.num_tokens;
  }
  const int64_t half = config.qk_rope_head_dim / 2;
  rows.positions.resize(rows.num_rows);
  rows.rope_cos.resize(rows.num_rows * half);
  rows.rope_sin.resize(rows.num_rows * half);
  for (const StepChunk& c : rows.chunks) {
    for (int64_t i = 0; i < c.num_tokens; ++i) {
      const int64_t t = c.row_begin + i;
      rows.positions[t] = c.start_pos + i;
      rope.cos_sin(c.start_pos + i, rows.rope_cos.data() + t * half,
                   rows.rope_sin.data() + t * half);
    }
  }
  return rows;
}

void DeepseekModel::Impl::embed(const Bf16Matrix& table, const StepRows& rows,
                                std::span<const ChunkView> chunks, float* x) const {
  const int64_t hidden = config.hidden_size;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (size_t i = 0; i < chunks[c].tokens.size(); ++i) {
      const int64_t t = rows.chunks[c].row_begin + static_cast<int64_t>(i);
      kernels::bf16_to_fp32(table.data + chunks[c].tokens[i] * hidden, x + t * hidden, hidden);
    }
  }
}

void DeepseekModel::Impl::run_mlp(const MlpWeights& w, const float* x, int64_t rows, float* out) {
  const int64_t inter = w.gate.rows;
  gate_.resize(rows * inter);
  up_.resize(rows * inter);
  kernels::MatmulBf16Args problems[2];
  for (int which = 0; which < 2; ++which) {
    problems[which].x = x;
    problems[which].w = which == 0 ? w.gate.data : w.up.data;
    problems[which].y = which == 0 ? gate_.data() : up_.data();
    problems[which].m = rows;
    problems[which].n = inter;
    problems[which].k = w.gate.cols;
  }
  kernels::grouped_matmul_bf16(problems, ctx.precision, ctx.pool);
  kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), rows * inter);
  linear(ctx, gate_.data(), rows, w.down, out);
}

Status DeepseekModel::Impl::run_moe(const DecoderLayerWeights& w, const float* x, int64_t rows,
                                    float* out) {
  const MoeWeights& moe = *w.moe;
  const int64_t n = config.n_routed_experts, hidden = config.hidden_size;
  const int64_t top_k = config.num_experts_per_tok;
  // Router logits in fp32, as HF computes them: {rows, n_routed_experts}
  router_logits_.resize(rows * n);
  kernels::MatmulF32Args args;
  args.x = x;
  args.w = moe.router.data();
  args.y = router_logits_.data();
  args.m = rows;
  args.n = n;
  args.k = hidden;
  kernels::matmul_f32(args, ctx.pool);
  route_scratch_.resize(2 * n);
  route_ids_.resize(rows * top_k);
  route_weights_.resize(rows * top_k);
  for (int64_t t = 0; t < rows; ++t) {
    route_token(config, {router_logits_.data() + t * n, static_cast<size_t>(n)}, moe.bias,
                route_scratch_, {route_ids_.data() + t * top_k, static_cast<size_t>(top_k)},
                {route_weights_.data() + t * top_k, static_cast<size_t>(top_k)});
  }
  RoutedTokens routed;
  routed.layer = w.index;
  routed.num_tokens = rows;
  routed.hidden_size = hidden;
  routed.top_k = top_k;
  routed.activations = {x, static_cast<size_t>(rows * hidden)};
  routed.expert_ids = route_ids_;
  routed.weights = route_weights_;
  PS_RETURN_IF_ERROR(experts->run(routed, {out, static_cast<size_t>(rows * hidden)}));
  if (moe.shared) {
    shared_.resize(rows * hidden);
    run_mlp(*moe.shared, x, rows, shared_.data());
    for (int64_t i = 0; i < rows * hidden; ++i) out[i] += shared_[i];
  }
  return ok_status();
}

Status DeepseekModel::Impl::run_layer(const DecoderLayerWeights& w, int64_t kv_layer,
                                      const StepRows& rows, LatentKvCache& cache) {
  const int64_t t_rows = rows.num_rows, hidden = config.hidden_size;
  const float eps = static_cast<float>(config.rms_norm_eps);
  x_norm_.resize(t_rows * hidden);
  branch_.resize(t_rows * hidden);
  kernels::rmsnorm(
      {.x = x_.data(), .out = x_norm_.data(), .rows = t_rows, .dim = hidden, .eps = eps},
      w.input_norm.data());
  attention.forward(ctx, w.attention, rows, kv_layer, x_norm_.data(), cache, branch_.data());
  for (int64_t i = 0; i < t_rows * hidden; ++i) x_[i] += branch_[i];
  kernels::rmsnorm(
      {.x = x_.data(), .out = x_norm_.data(), .rows = t_rows, .dim = hidden, .eps = eps},
      w.post_attention_norm.data());
  if (w.dense_mlp) {
    run_mlp(*w.dense_mlp, x_norm_.data(), t_rows, branch_.data());
  } else {
    PS_RETURN_IF_ERROR(run_moe(w, x_norm_.data(), t_rows, branch_.data()));
  }
  for (int64_t i = 0; i < t_rows * hidden; ++i) x_[i] += branch_[i];
  return ok_status();
}

void DeepseekModel::Impl::finish(std::span<const ChunkView> chunks, const StepRows& rows,
                                 const std::vector<float>& norm, const Bf16Matrix& head,
                                 ForwardOutput* out) {
  const int64_t hidden = config.hidden_size, vocab = head.rows;
  out->vocab_size = vocab;
  out->hidden_size = hidden;
  out->row_offsets.assign(1, 0);
  int64_t num_out = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    num_out += chunks[c].all_logits ? rows.chunks[c].num_tokens : 1;
    out->row_offsets.push_back(num_out);
  }
  out->hidden.resize(num_out * hidden);
  int64_t r = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const StepChunk& chunk = rows.chunks[c];
    const int64_t first = chunks[c].all_logits ? 0 : chunk.num_tokens - 1;
    for (int64_t i = first; i < chunk.num_tokens; ++i, ++r) {
      std::memcpy(out->hidden.data() + r * hidden, x_.data() + (chunk.row_begin + i) * hidden,
                  hidden * sizeof(float));
    }
  }
  kernels::rmsnorm({.x = out->hidden.data(),
                    .out = out->hidden.data(),
                    .rows = num_out,
                    .dim = hidden,
                    .eps = static_cast<float>(config.rms_norm_eps)},
                   norm.data());
  out->logits.resize(num_out * vocab);
  linear(ctx, out->hidden.data(), num_out, head, out->logits.data());
}

DeepseekModel::DeepseekModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekModel::~DeepseekModel() = default;

Result<std::unique_ptr<DeepseekModel>> DeepseekModel::load(const std::string& dir,
                                                           const ModelOptions& options) {
  CheckpointOptions checkpoint_options;
  checkpoint_options.progress = options.progress;
  PS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(dir, checkpoint_options));
  return from_checkpoint(checkpoint, options);
}

Result<std::unique_ptr<DeepseekModel>> DeepseekModel::from_checkpoint(Checkpoint& checkpoint,
                                                                      const ModelOptions& options) {
  PS_ASSIGN_OR_RETURN(DeepseekWeights weights, load_deepseek_weights(checkpoint, options.load_mtp));
  auto impl = std::make_unique<Impl>(checkpoint.config(), options, std::move(weights));
  return std::unique_ptr<DeepseekModel>(new DeepseekModel(std::move(impl)));
}

const ModelConfig& DeepseekModel::config() const {
  return impl_->config;
}
const ModelOptions& DeepseekModel::options() const {
  return impl_->options;
}
bool DeepseekModel::has_mtp() const {
  return impl_->weights.mtp.has_value();
}

KvLayout DeepseekModel::kv_layout(int64_t block_size, DType dtype) const {
  KvLayout layout;
  layout.num_layers = impl_->config.num_hidden_layers + (has_mtp() ? 1 : 0);
  layout.latent_dim = impl_->config.kv_lora_rank;
  layout.rope_dim = impl_->config.qk_rope_head_dim;
  layout.block_size = block_size;
  layout.dtype = dtype;
  return layout;
}

std::shared_ptr<ExpertBackend> DeepseekModel::expert_backend() const {
  return impl_->experts;
}

void DeepseekModel::set_expert_backend(std::shared_ptr<ExpertBackend> backend) {
  impl_->experts = std::move(backend);
}

Status DeepseekModel::forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache,
                              ForwardOutput* out) {
  Impl& m = *impl_;
  std::vector<ChunkView> views;
  views.reserve(chunks.size());
  for (const SequenceChunk& c : chunks) {
    views.push_back({c.tokens, c.start_pos, c.block_table, c.all_logits});
  }
  PS_RETURN_IF_ERROR(m.validate("forward", views, cache, m.config.num_hidden_layers));
  if (views.empty()) {
    *out = ForwardOutput{m.config.vocab_size, m.config.hidden_size, {}, {0}, {}};
    return ok_status();
  }
  const StepRows rows = m.plan(views);
  m.x_.resize(rows.num_rows * m.config.hidden_size);
  m.embed(m.weights.embed, rows, views, m.x_.data());
  for (const DecoderLayerWeights& layer : m.weights.layers) {
    PS_RETURN_IF_ERROR(m.run_layer(layer, layer.index, rows, cache));
  }
  m.finish(views, rows, m.weights.final_norm, m.weights.lm_head, out);
  return ok_status();
}

Status DeepseekModel::forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache,
                                  ForwardOutput* out) {
  Impl& m = *impl_;
  if (!m.weights.mtp) {
    return unimplemented(
        "forward_mtp: the model has no MTP layer loaded (num_nextn_predict_layers = " +
        std::to_string(m.config.num_nextn_predict_layers) + ")");
  }
  const int64_t hidden = m.config.hidden_size;
  std::vector<ChunkView> views;
  views.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& c = chunks[i];
    if (c.hidden.size() != c.next_tokens.size() * hidden) {
      return invalid_argument(seq_label("forward_mtp", i) + "hidden has " +
                              std::to_string(c.hidden.size()) + " values, expected " +
                              std::to_string(c.next_tokens.size()) + " x " +
                              std::to_string(hidden));
    }
    views.push_back({c.next_tokens, c.start_pos, c.block_table, c.all_logits});
  }
  const int64_t mtp_slot = m.config.num_hidden_layers;
  PS_RETURN_IF_ERROR(m.validate("forward_mtp", views, cache, mtp_slot + 1));
  if (views.empty()) {
    *out = ForwardOutput{m.config.vocab_size, hidden, {}, {0}, {}};
    return ok_status();
  }
  const StepRows rows = m.plan(views);
  const MtpWeights& mtp = *m.weights.mtp;
  const int64_t t_rows = rows.num_rows;
  const float eps = static_cast<float>(m.config.rms_norm_eps);

  // h' = eh_proj([enorm(embed(t_{p+1})) ; hnorm(h_p)])   {t_rows, 2 * hidden} -> {t_rows, hidden}
  m.x_.resize(t_rows * hidden);
  m.embed(mtp.embed, rows, views, m.x_.data());
  m.concat_.resize(t_rows * 2 * hidden);
  kernels::rmsnorm({.x = m.x_.data(),
                    .out = m.concat_.data(),
                    .out_stride = 2 * hidden,
                    .rows = t_rows,
                    .dim = hidden,
                    .eps = eps},
                   mtp.enorm.data());
  for (size_t c = 0; c < chunks.size(); ++c) {
    kernels::rmsnorm({.x = chunks[c].hidden.data(),
                      .out = m.concat_.data() + rows.chunks[c].row_begin * 2 * hidden + hidden,
                      .out_stride = 2 * hidden,
                      .rows = rows.chunks[c].num_tokens,
                      .dim = hidden,
                      .eps = eps},
                     mtp.hnorm.data());
  }
  linear(m.ctx, m.concat_.data(), t_rows, mtp.eh_proj, m.x_.data());
  PS_RETURN_IF_ERROR(m.run_layer(mtp.layer, mtp_slot, rows, cache));
  m.finish(views, rows, mtp.head_norm, mtp.head, out);
  return ok_status();
}

}  // namespace peerserve
