// The DeepSeek-V3 decoder, top to bottom: embeddings -> per layer [RMSNorm -> MLA ->
// residual -> RMSNorm -> dense MLP or MoE (routed experts via ExpertBackend + shared
// experts) -> residual] -> final RMSNorm -> LM head; and the MTP layer on top.
#include "model/deepseek_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/bf16_convert.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "kernels/rmsnorm.h"
#include "kernels/vector_ops.h"
#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_weights.h"
#include "model/forward_step.h"
#include "model/local_expert_backend.h"
#include "model/mla_attention.h"
#include "model/moe_router.h"
#include "model/replicated_weights_backend.h"
#include "model/rotary_embedding.h"
#include "model/weight_packing.h"
#include "model/weight_quantization.h"

namespace peerserve {
namespace {

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
        attention_layer(config, rope) {
    ctx.pool = &pool;
    ctx.precision = options.gemm_precision == GemmPrecision::kFp32
                        ? kernels::ActivationPrecision::kFp32
                        : kernels::ActivationPrecision::kBf16;
    std::vector<HeldExperts> held(config.num_hidden_layers + 1);
    for (const DecoderLayerWeights& layer : weights.layers) {
      if (layer.moe) held[layer.index] = {layer.moe->experts, layer.moe->expert_ids};
    }
    if (weights.mtp && weights.mtp->layer.moe) {
      const MoeWeights& moe = *weights.mtp->layer.moe;
      held[config.num_hidden_layers] = {moe.experts, moe.expert_ids};
    }
    experts = std::make_shared<LocalExpertBackend>(std::move(held), ctx.precision, &pool);
  }

  Status validate(const char* what, std::span<const ChunkView> chunks, const LatentKvCache& cache,
                  int64_t kv_layers_needed) const;
  void plan(std::span<const ChunkView> chunks, StepRows* rows) const;
  void embed(const LinearWeight& table, const ForwardState& state, float* x) const;
  // Shared by begin_forward and begin_forward_mtp: the state takes the step.
  void begin(ForwardState& state, LatentKvCache& cache);
  ExpertBackend::Call& expert_call(ForwardState& state);
  void run_mlp(ForwardState& state, const MlpWeights& w, const float* x, int64_t rows, float* out);
  // A dense MLP or shared expert of `layer`: through the replicated-weights backend when one is
  // installed and takes the call, else run_mlp.
  Status replicated_mlp(ForwardState& state, const StepLayer& layer, const MlpWeights& w,
                        float* out);

  // The stages (forward_state.h).
  Status attention(ForwardState& state, const StepLayer& layer);
  // Before the last layer's attention: rows whose output the step does not return write
  // their KV and leave the step (ModelOptions::skip_unreturned_rows).
  void drop_unreturned_rows(ForwardState& state, const StepLayer& layer);
  Status dense_mlp(ForwardState& state, const StepLayer& layer);
  void route(ForwardState& state, const StepLayer& layer);
  Status dispatch(ForwardState& state, const StepLayer& layer);
  Status shared_expert(ForwardState& state, const StepLayer& layer);
  Status combine(ForwardState& state, const StepLayer& layer);
  Status head(ForwardState& state);
  // Moves the state to the next layer's first stage, or to the head after the last layer.
  void next_layer(ForwardState& state) const;

  ModelConfig config;
  ModelOptions options;
  DeepseekWeights weights;
  ThreadPool pool;
  ComputeContext ctx;
  RotaryEmbedding rope;
  MlaAttention attention_layer;
  std::shared_ptr<ExpertBackend> experts;
  std::shared_ptr<ReplicatedWeightsBackend> replicated_weights;  // null: run_mlp
  bool draft_layer_requantized = false;  // quantize_draft_int8 changed the MTP layer

  // The replicated-weights backend a step may use: none in an interleaved step, whose
  // stages alternate with another microbatch's and would interleave the collective calls.
  ReplicatedWeightsBackend* replicated_for(const ForwardState& state) const {
    return state.interleaved ? nullptr : replicated_weights.get();
  }
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
  // (block, chunk) of every block a chunk writes; kept between calls (no allocation per step).
  thread_local std::vector<std::pair<int32_t, size_t>> writers;
  writers.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkView& chunk = chunks[i];
    auto label = [&] { return seq_label(what, i); };  // built only for an error
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    if (n == 0) return invalid_argument(label() + "no new tokens, expected at least one");
    for (int64_t t = 0; t < n; ++t) {
      if (chunk.tokens[t] < 0 || chunk.tokens[t] >= config.vocab_size) {
        return invalid_argument(label() + "token id " + std::to_string(chunk.tokens[t]) +
                                " at index " + std::to_string(t) +
                                " is outside the vocabulary [0, " +
                                std::to_string(config.vocab_size) + ")");
      }
    }
    if (chunk.start_pos < 0) {
      return invalid_argument(label() + "start_pos = " + std::to_string(chunk.start_pos) +
                              ", expected >= 0");
    }
    const int64_t end = chunk.start_pos + n;
    if (end > config.max_position_embeddings) {
      return out_of_range(label() + "positions [" + std::to_string(chunk.start_pos) + ", " +
                          std::to_string(end) + ") go beyond max_position_embeddings = " +
                          std::to_string(config.max_position_embeddings));
    }
    const int64_t blocks_needed = layout.blocks_for_tokens(end);
    if (static_cast<int64_t>(chunk.block_table.size()) < blocks_needed) {
      return invalid_argument(label() + "block table has " +
                              std::to_string(chunk.block_table.size()) +
                              " blocks, expected at least " + std::to_string(blocks_needed) +
                              " to cover positions [0, " + std::to_string(end) + ") with " +
                              std::to_string(layout.block_size) + " tokens per block");
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = chunk.block_table[b];
      if (id < 0 || id >= cache.num_blocks()) {
        return invalid_argument(label() + "block id " + std::to_string(id) +
                                " at block table index " + std::to_string(b) +
                                " is outside the cache [0, " + std::to_string(cache.num_blocks()) +
                                ")");
      }
    }
    for (int64_t b = chunk.start_pos / layout.block_size; b < blocks_needed; ++b) {
      writers.emplace_back(chunk.block_table[b], i);
    }
  }
  std::sort(writers.begin(), writers.end());
  for (size_t k = 1; k < writers.size(); ++k) {
    const auto [block, first] = writers[k - 1];
    const auto [same_block, other] = writers[k];
    if (block == same_block && first != other) {
      return invalid_argument(seq_label(what, other) + "block " + std::to_string(block) +
                              " is also written by sequence " + std::to_string(first) +
                              " in the same step");
    }
  }
  return ok_status();
}

void DeepseekModel::Impl::plan(std::span<const ChunkView> chunks, StepRows* rows) const {
  rows->chunks.clear();
  rows->num_rows = 0;
  for (const ChunkView& c : chunks) {
    StepChunk step;
    step.row_begin = rows->num_rows;
    step.num_tokens = static_cast<int64_t>(c.tokens.size());
    step.start_pos = c.start_pos;
    step.block_table = c.block_table;
    step.absorbed =
        c.decode_form
            ? choose_absorbed_form(config, options.attention_form, 1, step.start_pos + 1)
            : choose_absorbed_form(config, options.attention_form, step.num_tokens, step.context());
    rows->chunks.push_back(step);
    rows->num_rows += step.num_tokens;
  }
  const int64_t half = config.qk_rope_head_dim / 2;
  rows->positions.resize(rows->num_rows);
  rows->rope_cos.resize(rows->num_rows * half);
  rows->rope_sin.resize(rows->num_rows * half);
  for (const StepChunk& c : rows->chunks) {
    for (int64_t i = 0; i < c.num_tokens; ++i) {
      const int64_t t = c.row_begin + i;
      rows->positions[t] = c.start_pos + i;
      rope.cos_sin(c.start_pos + i, rows->rope_cos.data() + t * half,
                   rows->rope_sin.data() + t * half);
    }
  }
}

void DeepseekModel::Impl::embed(const LinearWeight& table, const ForwardState& state,
                                float* x) const {
  const int64_t hidden = config.hidden_size;
  for (size_t c = 0; c < state.views.size(); ++c) {
    const ChunkView& view = state.views[c];
    for (size_t i = 0; i < view.tokens.size(); ++i) {
      const int64_t t = state.rows.chunks[c].row_begin + static_cast<int64_t>(i);
      kernels::bf16_to_fp32(table.data + view.tokens[i] * hidden, x + t * hidden, hidden);
    }
  }
}

void DeepseekModel::Impl::begin(ForwardState& state, LatentKvCache& cache) {
  state.cache = &cache;
  plan(state.views, &state.rows);
  state.layer_index = 0;
  // An empty step runs the layers only when the expert backend needs every process at
  // every exchange; otherwise there is nothing to compute.
  const bool run_layers = state.rows.num_rows > 0 || experts->collective();
  state.current =
      run_layers && !state.layers.empty() ? ForwardStage::kAttention : ForwardStage::kHead;
}

ExpertBackend::Call& DeepseekModel::Impl::expert_call(ForwardState& state) {
  // The same backend shares the weak pointer's control block, which the weak pointer keeps
  // alive (no later backend can have it): compared without lock()'s atomic increments, once
  // per MoE layer and microbatch.
  const bool same_backend = !state.expert_call_owner.owner_before(experts) &&
                            !experts.owner_before(state.expert_call_owner);
  if (state.expert_call == nullptr || !same_backend) {
    state.expert_call = experts->new_call(state.slot);
    state.expert_call_owner = experts;
  }
  return *state.expert_call;
}

void DeepseekModel::Impl::run_mlp(ForwardState& state, const MlpWeights& w, const float* x,
                                  int64_t rows, float* out) {
  const int64_t inter = w.gate.rows;
  state.gate.resize(rows * inter);
  if (w.gate_up_int8) {
    // W8A8: gate, up and SiLU in one pass over x, then the INT8 down projection.
    kernels::GateUpInt8Args args;
    args.x = x;
    args.gate_up = w.gate_up_int8.get();
    args.out = state.gate.data();
    args.m = rows;
    kernels::gate_up_silu_int8(args, ctx.pool);
    linear(ctx, state.gate.data(), rows, w.down, out);
    return;
  }
  state.up.resize(rows * inter);
  bf16_mlp(ctx, w, x, rows, state.gate.data(), state.up.data(), out);
}

void DeepseekModel::Impl::drop_unreturned_rows(ForwardState& state, const StepLayer& layer) {
  StepRows& rows = state.rows;
  const int64_t hidden = config.hidden_size;
  // Decode steps drop nothing: leave before building anything.
  bool any = false;
  for (size_t c = 0; c < rows.chunks.size() && !any; ++c) {
    any = state.views[c].hidden_rows(rows.chunks[c].num_tokens) < rows.chunks[c].num_tokens;
  }
  if (!any) return;
  // Per chunk, the rows it returns (all, the last, or none) stay; the ones before them only
  // write their KV. Both sets are laid out again by plan(), as views of the chunk's tokens.
  std::vector<ChunkView>& dropped_views = state.kv_only_views;
  std::vector<ChunkView>& kept_views = state.kept_views;
  std::vector<bool>& absorbed = state.kept_absorbed;
  dropped_views.clear();
  kept_views.clear();
  absorbed.clear();
  for (size_t c = 0; c < rows.chunks.size(); ++c) {
    const StepChunk& chunk = rows.chunks[c];
    const ChunkView& view = state.views[c];
    const int64_t skip = chunk.num_tokens - view.hidden_rows(chunk.num_tokens);
    if (skip > 0) {
      dropped_views.push_back({.tokens = view.tokens.first(skip),
                               .start_pos = chunk.start_pos,
                               .block_table = chunk.block_table});
    }
    kept_views.push_back({.tokens = view.tokens.subspan(skip),
                          .start_pos = chunk.start_pos + skip,
                          .block_table = chunk.block_table});
    absorbed.push_back(chunk.absorbed);
  }

  // The dropped rows: gathered, normed and projected to their latents, which go into the
  // cache; the kept rows then attend over them like over any context token.
  StepRows& dropped = state.kv_only_rows;
  plan(dropped_views, &dropped);
  state.kv_only_x_norm.resize(dropped.num_rows * hidden);
  for (size_t c = 0, d = 0; c < rows.chunks.size(); ++c) {
    const StepChunk& chunk = rows.chunks[c];
    const int64_t skip = chunk.num_tokens - static_cast<int64_t>(kept_views[c].tokens.size());
    if (skip == 0) continue;
    std::memcpy(state.kv_only_x_norm.data() + dropped.chunks[d++].row_begin * hidden,
                state.x.data() + chunk.row_begin * hidden, skip * hidden * sizeof(float));
  }
  const DecoderLayerWeights& w = *layer.weights;
  rmsnorm_rows(ctx,
               {.x = state.kv_only_x_norm.data(),
                .out = state.kv_only_x_norm.data(),
                .rows = dropped.num_rows,
                .dim = hidden,
                .eps = static_cast<float>(config.rms_norm_eps)},
               w.input_norm.data());
  attention_layer.write_latents(ctx, w.attention, dropped, layer.kv_slot,
                                state.kv_only_x_norm.data(), *state.cache, state.attention);

  // The kept rows move down in place (a row only ever moves to a lower index). Each chunk
  // keeps its attention form, so its kept rows compute what they would have with the others.
  int64_t r = 0;
  for (size_t c = 0; c < rows.chunks.size(); ++c) {
    const StepChunk& chunk = rows.chunks[c];
    const int64_t keep = static_cast<int64_t>(kept_views[c].tokens.size());
    const int64_t from = chunk.row_begin + chunk.num_tokens - keep;
    if (from != r) {
      std::memmove(state.x.data() + r * hidden, state.x.data() + from * hidden,
                   keep * hidden * sizeof(float));
    }
    r += keep;
  }
  state.x.resize(r * hidden);
  plan(kept_views, &rows);
  for (size_t c = 0; c < rows.chunks.size(); ++c) rows.chunks[c].absorbed = absorbed[c];
}

Status DeepseekModel::Impl::attention(ForwardState& state, const StepLayer& layer) {
  const DecoderLayerWeights& w = *layer.weights;
  // (The dropped rows' latents are projected here, not offered to a replicated-weights
  // backend: its collective calls stay the same on every rank, with the kept rows.)
  if (options.skip_unreturned_rows &&
      state.layer_index + 1 == static_cast<int64_t>(state.layers.size())) {
    drop_unreturned_rows(state, layer);
  }
  const int64_t t_rows = state.rows.num_rows, hidden = config.hidden_size;
  const float eps = static_cast<float>(config.rms_norm_eps);
  state.x_norm.resize(t_rows * hidden);
  state.branch.resize(t_rows * hidden);
  rmsnorm_rows(
      ctx,
      {.x = state.x.data(), .out = state.x_norm.data(), .rows = t_rows, .dim = hidden, .eps = eps},
      w.input_norm.data());
  PS_RETURN_IF_ERROR(attention_layer.forward(ctx, w.attention, state.rows, layer.kv_slot,
                                             state.x_norm.data(), *state.cache, state.attention,
                                             state.branch.data(), replicated_for(state), w.index));
  add_rows(ctx, state.x.data(), state.branch.data(), t_rows, hidden);
  rmsnorm_rows(
      ctx,
      {.x = state.x.data(), .out = state.x_norm.data(), .rows = t_rows, .dim = hidden, .eps = eps},
      w.post_attention_norm.data());
  state.current = w.dense_mlp ? ForwardStage::kDenseMlp : ForwardStage::kRoute;
  return ok_status();
}

Status DeepseekModel::Impl::replicated_mlp(ForwardState& state, const StepLayer& layer,
                                           const MlpWeights& w, float* out) {
  const int64_t rows = state.rows.num_rows;
  if (ReplicatedWeightsBackend* split = replicated_for(state); split != nullptr) {
    PS_ASSIGN_OR_RETURN(const bool done,
                        split->run_mlp(ctx, layer.weights->index, state.x_norm.data(), rows, out));
    if (done) return ok_status();
  }
  run_mlp(state, w, state.x_norm.data(), rows, out);
  return ok_status();
}

Status DeepseekModel::Impl::dense_mlp(ForwardState& state, const StepLayer& layer) {
  const int64_t t_rows = state.rows.num_rows;
  PS_RETURN_IF_ERROR(replicated_mlp(state, layer, *layer.weights->dense_mlp, state.branch.data()));
  add_rows(ctx, state.x.data(), state.branch.data(), t_rows, config.hidden_size);
  next_layer(state);
  return ok_status();
}

void DeepseekModel::Impl::route(ForwardState& state, const StepLayer& layer) {
  const MoeWeights& moe = *layer.weights->moe;
  const int64_t rows = state.rows.num_rows;
  const int64_t n = config.n_routed_experts, top_k = config.num_experts_per_tok;
  // Router logits in fp32, as HF computes them: {rows, n_routed_experts}
  state.router_logits.resize(rows * n);
  kernels::MatmulF32Args args;
  args.x = state.x_norm.data();
  args.w = moe.router.data();
  args.y = state.router_logits.data();
  args.m = rows;
  args.n = n;
  args.k = config.hidden_size;
  kernels::matmul_f32(args, ctx.pool);
  state.route_scratch.resize(row_range_parts(ctx) * 2 * n);
  state.route_ids.resize(rows * top_k);
  state.route_weights.resize(rows * top_k);
  for_row_ranges(ctx, rows, [&](int64_t t0, int64_t t1, int part) {
    const std::span<float> scratch(state.route_scratch.data() + part * 2 * n,
                                   static_cast<size_t>(2 * n));
    for (int64_t t = t0; t < t1; ++t) {
      route_token(config, {state.router_logits.data() + t * n, static_cast<size_t>(n)}, moe.bias,
                  scratch, {state.route_ids.data() + t * top_k, static_cast<size_t>(top_k)},
                  {state.route_weights.data() + t * top_k, static_cast<size_t>(top_k)});
    }
  });
  state.current = ForwardStage::kDispatch;
}

Status DeepseekModel::Impl::dispatch(ForwardState& state, const StepLayer& layer) {
  const int64_t rows = state.rows.num_rows, hidden = config.hidden_size;
  RoutedTokens routed;
  routed.layer = layer.weights->index;
  routed.num_tokens = rows;
  routed.hidden_size = hidden;
  routed.top_k = config.num_experts_per_tok;
  routed.activations = {state.x_norm.data(), static_cast<size_t>(rows * hidden)};
  routed.expert_ids = state.route_ids;
  routed.weights = state.route_weights;
  PS_RETURN_IF_ERROR(experts->dispatch(routed, expert_call(state)));
  state.current = ForwardStage::kSharedExpert;
  return ok_status();
}

Status DeepseekModel::Impl::shared_expert(ForwardState& state, const StepLayer& layer) {
  const MoeWeights& moe = *layer.weights->moe;
  const int64_t rows = state.rows.num_rows;
  if (moe.shared) {
    state.shared.resize(rows * config.hidden_size);
    PS_RETURN_IF_ERROR(replicated_mlp(state, layer, *moe.shared, state.shared.data()));
  }
  state.current = ForwardStage::kExperts;
  return ok_status();
}

Status DeepseekModel::Impl::combine(ForwardState& state, const StepLayer& layer) {
  const int64_t count = state.rows.num_rows * config.hidden_size;
  PS_RETURN_IF_ERROR(
      experts->combine(expert_call(state), {state.branch.data(), static_cast<size_t>(count)}));
  const int64_t rows = state.rows.num_rows;
  if (layer.weights->moe->shared) {
    if (ReplicatedWeightsBackend* split = replicated_for(state); split != nullptr) {
      PS_RETURN_IF_ERROR(split->finish_mlp());
    }
    add_rows(ctx, state.branch.data(), state.shared.data(), rows, config.hidden_size);
  }
  add_rows(ctx, state.x.data(), state.branch.data(), rows, config.hidden_size);
  next_layer(state);
  return ok_status();
}

void DeepseekModel::Impl::next_layer(ForwardState& state) const {
  ++state.layer_index;
  state.current = state.layer_index < static_cast<int64_t>(state.layers.size())
                      ? ForwardStage::kAttention
                      : ForwardStage::kHead;
}

Status DeepseekModel::Impl::head(ForwardState& state) {
  const int64_t hidden = config.hidden_size, vocab = state.head->rows;
  ForwardOutput* out = &state.output;
  out->vocab_size = vocab;
  out->hidden_size = hidden;
  out->row_offsets.assign(1, 0);
  out->hidden_row_offsets.assign(1, 0);
  int64_t num_out = 0, num_hidden = 0;
  bool same_rows = true;  // every hidden row also gets logits
  for (size_t c = 0; c < state.views.size(); ++c) {
    const ChunkView& view = state.views[c];
    const int64_t n = state.rows.chunks[c].num_tokens;
    num_out += view.logits_rows(n);
    num_hidden += view.hidden_rows(n);
    same_rows = same_rows && view.logits_rows(n) == view.hidden_rows(n);
    out->row_offsets.push_back(num_out);
    out->hidden_row_offsets.push_back(num_hidden);
  }
  out->hidden.resize(num_hidden * hidden);
  int64_t r = 0;
  for (size_t c = 0; c < state.views.size(); ++c) {
    const StepChunk& chunk = state.rows.chunks[c];
    const ChunkView& view = state.views[c];
    const int64_t first = chunk.num_tokens - view.hidden_rows(chunk.num_tokens);
    for (int64_t i = first; i < chunk.num_tokens; ++i, ++r) {
      std::memcpy(out->hidden.data() + r * hidden, state.x.data() + (chunk.row_begin + i) * hidden,
                  hidden * sizeof(float));
    }
  }
  kernels::rmsnorm({.x = out->hidden.data(),
                    .out = out->hidden.data(),
                    .rows = num_hidden,
                    .dim = hidden,
                    .eps = static_cast<float>(config.rms_norm_eps)},
                   state.head_norm->data());
  out->logits.resize(num_out * vocab);
  // The main model's head may be split over expert-parallel ranks (the MTP head is not).
  ReplicatedWeightsBackend* split =
      state.head == &weights.lm_head ? replicated_for(state) : nullptr;
  auto head_product = [&](const float* x) -> Status {
    if (split != nullptr) {
      float* const logits[1] = {out->logits.data()};
      PS_ASSIGN_OR_RETURN(
          const bool done,
          split->run_projection(ctx, 0, ReplicatedProjection::kLmHead, x, num_out, logits));
      if (done) return ok_status();
    }
    linear(ctx, x, num_out, *state.head, out->logits.data());
    return ok_status();
  };
  if (same_rows) {
    PS_RETURN_IF_ERROR(head_product(out->hidden.data()));
  } else {
    // Only the last hidden row of an all_hidden chunk gets logits: gather the logits rows.
    state.head_input.resize(num_out * hidden);
    int64_t o = 0;
    for (size_t c = 0; c < state.views.size(); ++c) {
      const int64_t begin = out->hidden_row_offsets[c], end = out->hidden_row_offsets[c + 1];
      const int64_t first = end - state.views[c].logits_rows(end - begin);
      for (int64_t h = first; h < end; ++h, ++o) {
        std::memcpy(state.head_input.data() + o * hidden, out->hidden.data() + h * hidden,
                    hidden * sizeof(float));
      }
    }
    PS_RETURN_IF_ERROR(head_product(state.head_input.data()));
  }
  state.current = ForwardStage::kDone;
  return ok_status();
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
  PS_ASSIGN_OR_RETURN(DeepseekWeights weights,
                      load_deepseek_weights(checkpoint, options.load_mtp, options.routed_experts));
  auto impl = std::make_unique<Impl>(checkpoint.config(), options, std::move(weights));
  // A weight given another form (INT8, packed BF16): its checkpoint pages are not kept
  // resident, the new form is what the kernels read.
  const auto release = [&](const LinearWeight& w) {
    checkpoint.release_pages(w.data, static_cast<size_t>(w.rows * w.cols) * sizeof(bf16));
  };
  if (options.quantize == WeightQuantization::kInt8) {
    PS_RETURN_IF_ERROR(
        quantize_weights_int8(impl->weights, options.quantize_lm_head, &impl->pool, release));
  }
  if (options.quantize_draft == WeightQuantization::kInt8) {
    PS_ASSIGN_OR_RETURN(impl->draft_layer_requantized,
                        quantize_draft_int8(impl->weights, &impl->pool, release));
  }
  if (packs_bf16_weights(options)) {
    PS_RETURN_IF_ERROR(
        pack_absorbed_attention_bf16(impl->weights, checkpoint.config(), &impl->pool));
    PS_RETURN_IF_ERROR(pack_weights_bf16(impl->weights, &impl->pool, release));
  }
  return std::unique_ptr<DeepseekModel>(new DeepseekModel(std::move(impl)));
}

Status DeepseekModel::prepare_routed_expert(int64_t layer, MlpWeights& expert) const {
  // The drafter's INT8 forms cover its routed experts (quantize_draft_int8 in one process).
  const bool draft_int8 = layer == impl_->config.num_hidden_layers &&
                          impl_->options.quantize_draft == WeightQuantization::kInt8;
  if (impl_->options.quantize == WeightQuantization::kInt8 || draft_int8) {
    PS_RETURN_IF_ERROR(quantize_mlp_int8(expert));
  }
  if (packs_bf16_weights(impl_->options)) PS_RETURN_IF_ERROR(pack_mlp_bf16(expert));
  return ok_status();
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
bool DeepseekModel::mtp_runs_int8() const {
  return impl_->weights.mtp && impl_->weights.mtp->eh_proj.int8 != nullptr;
}
bool DeepseekModel::draft_layer_requantized() const {
  return impl_->draft_layer_requantized;
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

std::span<const MlpWeights> DeepseekModel::held_experts(int64_t layer) const {
  const DeepseekWeights& w = impl_->weights;
  for (const DecoderLayerWeights& l : w.layers) {
    if (l.index == layer) {
      return l.moe ? std::span<const MlpWeights>(l.moe->experts) : std::span<const MlpWeights>();
    }
  }
  if (w.mtp && w.mtp->layer.index == layer && w.mtp->layer.moe) return w.mtp->layer.moe->experts;
  return {};
}

std::shared_ptr<ExpertBackend> DeepseekModel::expert_backend() const {
  return impl_->experts;
}

const DecoderLayerWeights* DeepseekModel::decoder_layer(int64_t layer) const {
  for (const DecoderLayerWeights& l : impl_->weights.layers) {
    if (l.index == layer) return &l;
  }
  return nullptr;
}

const LinearWeight* DeepseekModel::lm_head() const {
  return &impl_->weights.lm_head;
}

void DeepseekModel::set_replicated_weights_backend(
    std::shared_ptr<ReplicatedWeightsBackend> backend) {
  impl_->replicated_weights = std::move(backend);
}

void DeepseekModel::set_expert_backend(std::shared_ptr<ExpertBackend> backend) {
  impl_->experts = std::move(backend);
}

std::unique_ptr<ForwardState> DeepseekModel::new_forward_state(int slot) const {
  return std::make_unique<ForwardState>(slot);
}

namespace {

// Into `views` (its capacity is reused: no allocation per step).
void views_of(std::span<const SequenceChunk> chunks, std::vector<ChunkView>* views) {
  views->clear();
  for (const SequenceChunk& c : chunks) {
    views->push_back({.tokens = c.tokens,
                      .start_pos = c.start_pos,
                      .block_table = c.block_table,
                      .all_logits = c.all_logits,
                      .all_hidden = c.all_hidden,
                      .decode_form = c.decode_form});
  }
}

}  // namespace

Status DeepseekModel::validate_forward(std::span<const SequenceChunk> chunks,
                                       const LatentKvCache& cache) const {
  thread_local std::vector<ChunkView> views;
  views_of(chunks, &views);
  return impl_->validate("forward", views, cache, impl_->config.num_hidden_layers);
}

void DeepseekModel::abandon(ForwardState& state) {
  state.current = ForwardStage::kIdle;
  state.views.clear();
  state.cache = nullptr;
  // A call interrupted between its stages is not reused.
  if (state.expert_call != nullptr) {
    state.expert_call.reset();
    state.expert_call_owner.reset();
  }
}

Status DeepseekModel::begin_forward(ForwardState& state, std::span<const SequenceChunk> chunks,
                                    LatentKvCache& cache) {
  Impl& m = *impl_;
  PS_CHECK(state.current == ForwardStage::kIdle);  // take_output before the next step
  views_of(chunks, &state.views);
  if (Status s = m.validate("forward", state.views, cache, m.config.num_hidden_layers); !s.ok()) {
    state.views.clear();
    return s;
  }
  state.layers.clear();
  for (const DecoderLayerWeights& layer : m.weights.layers) {
    state.layers.push_back({&layer, layer.index});
  }
  state.head_norm = &m.weights.final_norm;
  state.head = &m.weights.lm_head;
  m.begin(state, cache);
  state.x.resize(state.rows.num_rows * m.config.hidden_size);
  m.embed(m.weights.embed, state, state.x.data());
  return ok_status();
}

Status DeepseekModel::begin_forward_mtp(ForwardState& state, std::span<const MtpChunk> chunks,
                                        LatentKvCache& cache) {
  Impl& m = *impl_;
  PS_CHECK(state.current == ForwardStage::kIdle);
  if (!m.weights.mtp) {
    return unimplemented(
        "forward_mtp: the model has no MTP layer loaded (num_nextn_predict_layers = " +
        std::to_string(m.config.num_nextn_predict_layers) + ")");
  }
  const int64_t hidden = m.config.hidden_size;
  std::vector<ChunkView>& views = state.views;  // its capacity is reused step after step
  views.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& c = chunks[i];
    if (c.hidden.size() != c.next_tokens.size() * hidden) {
      views.clear();
      return invalid_argument(seq_label("forward_mtp", i) + "hidden has " +
                              std::to_string(c.hidden.size()) + " values, expected " +
                              std::to_string(c.next_tokens.size()) + " x " +
                              std::to_string(hidden));
    }
    views.push_back({.tokens = c.next_tokens,
                     .start_pos = c.start_pos,
                     .block_table = c.block_table,
                     .all_logits = c.all_logits,
                     .kv_only = c.kv_only});
  }
  const int64_t mtp_slot = m.config.num_hidden_layers;
  if (Status s = m.validate("forward_mtp", views, cache, mtp_slot + 1); !s.ok()) {
    views.clear();
    return s;
  }
  const MtpWeights& mtp = *m.weights.mtp;
  state.layers.assign(1, {&mtp.layer, mtp_slot});
  state.head_norm = &mtp.head_norm;
  state.head = &mtp.head;
  m.begin(state, cache);

  // h' = eh_proj([enorm(embed(t_{p+1})) ; hnorm(h_p)])   {t_rows, 2 * hidden} -> {t_rows, hidden}
  const int64_t t_rows = state.rows.num_rows;
  const float eps = static_cast<float>(m.config.rms_norm_eps);
  state.x.resize(t_rows * hidden);
  m.embed(mtp.embed, state, state.x.data());
  state.concat.resize(t_rows * 2 * hidden);
  kernels::rmsnorm({.x = state.x.data(),
                    .out = state.concat.data(),
                    .out_stride = 2 * hidden,
                    .rows = t_rows,
                    .dim = hidden,
                    .eps = eps},
                   mtp.enorm.data());
  for (size_t c = 0; c < chunks.size(); ++c) {
    kernels::rmsnorm(
        {.x = chunks[c].hidden.data(),
         .out = state.concat.data() + state.rows.chunks[c].row_begin * 2 * hidden + hidden,
         .out_stride = 2 * hidden,
         .rows = state.rows.chunks[c].num_tokens,
         .dim = hidden,
         .eps = eps},
        mtp.hnorm.data());
  }
  linear(m.ctx, state.concat.data(), t_rows, mtp.eh_proj, state.x.data());
  return ok_status();
}

Status DeepseekModel::run_stage(ForwardState& state) {
  Impl& m = *impl_;
  PS_CHECK(state.current != ForwardStage::kIdle && state.current != ForwardStage::kDone);
  if (state.current == ForwardStage::kHead) {
    Status status = m.head(state);
    if (!status.ok()) abandon(state);
    return status;
  }
  const StepLayer& layer = state.layers[state.layer_index];
  Status status = ok_status();
  switch (state.current) {
    case ForwardStage::kAttention:
      status = m.attention(state, layer);
      break;
    case ForwardStage::kDenseMlp:
      status = m.dense_mlp(state, layer);
      break;
    case ForwardStage::kRoute:
      m.route(state, layer);
      break;
    case ForwardStage::kDispatch:
      status = m.dispatch(state, layer);
      break;
    case ForwardStage::kSharedExpert:
      status = m.shared_expert(state, layer);
      break;
    case ForwardStage::kExperts:
      status = m.experts->compute(m.expert_call(state));
      if (status.ok()) state.current = ForwardStage::kCombine;
      break;
    case ForwardStage::kCombine:
      status = m.combine(state, layer);
      break;
    default:
      PS_CHECK(false);
  }
  if (!status.ok()) abandon(state);
  return status;
}

Status DeepseekModel::run_until(ForwardState& state, ForwardStage stop) {
  while (state.current != stop && state.current != ForwardStage::kDone) {
    PS_RETURN_IF_ERROR(run_stage(state));
  }
  return ok_status();
}

void DeepseekModel::take_output(ForwardState& state, ForwardOutput* out) {
  PS_CHECK(state.current == ForwardStage::kDone);
  std::swap(*out, state.output);
  state.current = ForwardStage::kIdle;
  state.views.clear();
  state.cache = nullptr;
}

Status DeepseekModel::forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache,
                              ForwardState& state, ForwardOutput* out) {
  PS_RETURN_IF_ERROR(begin_forward(state, chunks, cache));
  PS_RETURN_IF_ERROR(run_until(state, ForwardStage::kDone));
  take_output(state, out);
  return ok_status();
}

Status DeepseekModel::forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache,
                              ForwardOutput* out) {
  ForwardState state(0);
  return forward(chunks, cache, state, out);
}

Status DeepseekModel::forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache,
                                  ForwardState& state, ForwardOutput* out) {
  PS_RETURN_IF_ERROR(begin_forward_mtp(state, chunks, cache));
  PS_RETURN_IF_ERROR(run_until(state, ForwardStage::kDone));
  take_output(state, out);
  return ok_status();
}

Status DeepseekModel::forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache,
                                  ForwardOutput* out) {
  ForwardState state(0);
  return forward_mtp(chunks, cache, state, out);
}

const char* forward_stage_name(ForwardStage stage) {
  switch (stage) {
    case ForwardStage::kIdle:
      return "idle";
    case ForwardStage::kAttention:
      return "attention";
    case ForwardStage::kDenseMlp:
      return "dense_mlp";
    case ForwardStage::kRoute:
      return "route";
    case ForwardStage::kDispatch:
      return "dispatch";
    case ForwardStage::kSharedExpert:
      return "shared_expert";
    case ForwardStage::kExperts:
      return "experts";
    case ForwardStage::kCombine:
      return "combine";
    case ForwardStage::kHead:
      return "head";
    case ForwardStage::kDone:
      return "done";
  }
  return "unknown";
}

}  // namespace peerserve
