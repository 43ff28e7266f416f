#include "model/mla_attention.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <type_traits>

#include "base/check.h"
#include "kernels/bf16_convert.h"
#include "kernels/bf16_panels.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/softmax.h"
#include "kernels/transpose.h"
#include "kernels/vector_ops.h"
#include "model/replicated_weights_backend.h"

namespace peerserve {
namespace {

// Queries per work item of the plain form: the scores of a tile are [tile, context] floats.
constexpr int64_t kQueryTile = 32;
// q_a_layernorm and kv_a_layernorm use the RMSNorm default of DeepSeek's and Hugging Face's
// modeling code, not config.rms_norm_eps (the same for DeepSeek's checkpoints; Moonlight's
// 1e-5 applies to the layer norms only).
constexpr float kLowRankNormEps = 1e-6f;

}  // namespace

bool choose_absorbed_form(const ModelConfig& c, AttentionForm form, int64_t num_tokens,
                          int64_t context) {
  if (form == AttentionForm::kPlain) return false;
  if (form == AttentionForm::kAbsorbed) return true;
  const double h = static_cast<double>(c.num_attention_heads);
  const double lora = static_cast<double>(c.kv_lora_rank);
  const double nope = static_cast<double>(c.qk_nope_head_dim);
  const double rope = static_cast<double>(c.qk_rope_head_dim);
  const double v = static_cast<double>(c.v_head_dim);
  const double n = static_cast<double>(num_tokens), s = static_cast<double>(context);
  const double plain = s * h * lora * (nope + v) + n * s * h * (nope + rope + v);
  const double absorbed = n * h * (nope * lora + lora * v) + n * s * h * (2 * lora + rope);
  return absorbed < plain;
}

MlaAttention::MlaAttention(const ModelConfig& config, const RotaryEmbedding& rope)
    : config_(config), rope_(rope), scale_(static_cast<float>(mla_softmax_scale(config))) {}

Status MlaAttention::forward(const ComputeContext& ctx, const AttentionWeights& w,
                             const StepRows& rows, int64_t kv_layer, const float* x_norm,
                             LatentKvCache& cache, MlaScratch& s, float* out,
                             ReplicatedWeightsBackend* replicated, int64_t layer) const {
  const int64_t t_rows = rows.num_rows, heads = config_.num_attention_heads;
  const int64_t qk = config_.qk_head_dim(), nope = config_.qk_nope_head_dim;
  const int64_t rope = config_.qk_rope_head_dim, lora = config_.kv_lora_rank;
  const int64_t width = lora + rope, v = config_.v_head_dim;
  const float eps = kLowRankNormEps;
  // Whether `replicated` took a projection (then it wrote the outputs).
  auto offered = [&](ReplicatedProjection which, const float* x,
                     std::initializer_list<float*> outputs) -> Result<bool> {
    if (replicated == nullptr) return false;
    const std::span<float* const> outs(outputs.begin(), outputs.size());
    return replicated->run_projection(ctx, layer, which, x, t_rows, outs);
  };

  // q_a (or q_proj) and kv_a both read x_norm: one grouped call, one barrier.
  // {t_rows, q_lora} or {t_rows, heads * qk}, and {t_rows, lora + rope} (c_kv then k_pe)
  s.q.resize(t_rows * heads * qk);
  s.kv_a.resize(t_rows * width);
  const LinearWeight& first = w.q_a ? *w.q_a : *w.q_proj;
  if (w.q_a) s.q_a.resize(t_rows * w.q_a->rows);
  LinearProblem projections[2];
  projections[0].x = x_norm;
  projections[0].w = &first;
  projections[0].y = w.q_a ? s.q_a.data() : s.q.data();
  projections[0].m = t_rows;
  projections[1].x = x_norm;
  projections[1].w = &w.kv_a;
  projections[1].y = s.kv_a.data();
  projections[1].m = t_rows;
  PS_ASSIGN_OR_RETURN(const bool down_done, offered(ReplicatedProjection::kAttentionDown, x_norm,
                                                    {projections[0].y, projections[1].y}));
  if (!down_done) grouped_linear(ctx, projections);
  if (w.q_a) {
    const int64_t q_lora = w.q_a->rows;
    rmsnorm_rows(
        ctx, {.x = s.q_a.data(), .out = s.q_a.data(), .rows = t_rows, .dim = q_lora, .eps = eps},
        w.q_a_norm.data());
    PS_ASSIGN_OR_RETURN(const bool up_done, offered(ReplicatedProjection::kAttentionQueryUp,
                                                    s.q_a.data(), {s.q.data()}));
    if (!up_done) linear(ctx, s.q_a.data(), t_rows, *w.q_b, s.q.data());
  }
  const int64_t half = rope / 2;
  for_row_ranges(ctx, t_rows, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cos = rows.rope_cos.data() + t * half;
      const float* sin = rows.rope_sin.data() + t * half;
      for (int64_t h = 0; h < heads; ++h)
        rope_.rotate(cos, sin, s.q.data() + (t * heads + h) * qk + nope);
    }
  });
  // The new tokens' latents go into the cache first; attention then reads every context
  // token from the cache, so a token's keys are the same whichever step wrote them.
  store_latents(ctx, w, rows, kv_layer, cache, s);

  s.attn.assign(t_rows * heads * v, 0.0f);  // {t_rows, heads * v}
  for (const StepChunk& chunk : rows.chunks) {
    // (A chunk whose rows were all dropped has no query left: DeepseekModel's last layer.)
    if (!chunk.absorbed && chunk.num_tokens > 0) attend_plain(ctx, w, chunk, kv_layer, cache, s);
  }
  attend_absorbed(ctx, w, rows, kv_layer, cache, s);
  PS_ASSIGN_OR_RETURN(const bool out_done,
                      offered(ReplicatedProjection::kAttentionOutput, s.attn.data(), {out}));
  if (!out_done) linear(ctx, s.attn.data(), t_rows, w.o_proj, out);
  return ok_status();
}

void MlaAttention::gather_context(const StepChunk& chunk, int64_t kv_layer,
                                  const LatentKvCache& cache, MlaScratch& s) const {
  const KvLayout& layout = cache.layout();
  const int64_t width = layout.token_width(), block_size = layout.block_size;
  const int64_t context = chunk.context();
  s.ctx.resize(context * width);  // {context, lora + rope}
  for (int64_t b = 0; b * block_size < context; ++b) {
    const int64_t tokens = std::min(block_size, context - b * block_size);
    const std::byte* src = cache.layer_block(kv_layer, chunk.block_table[b]);
    float* dst = s.ctx.data() + b * block_size * width;
    if (layout.dtype == DType::kBF16) {
      kernels::bf16_to_fp32(reinterpret_cast<const bf16*>(src), dst, tokens * width);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(tokens * width) * sizeof(float));
    }
  }
}

void MlaAttention::write_latents(const ComputeContext& ctx, const AttentionWeights& w,
                                 const StepRows& rows, int64_t kv_layer, const float* x_norm,
                                 LatentKvCache& cache, MlaScratch& s) const {
  s.kv_a.resize(rows.num_rows * (config_.kv_lora_rank + config_.qk_rope_head_dim));
  linear(ctx, x_norm, rows.num_rows, w.kv_a, s.kv_a.data());
  store_latents(ctx, w, rows, kv_layer, cache, s);
}

void MlaAttention::store_latents(const ComputeContext& ctx, const AttentionWeights& w,
                                 const StepRows& rows, int64_t kv_layer, LatentKvCache& cache,
                                 MlaScratch& s) const {
  const int64_t t_rows = rows.num_rows, lora = config_.kv_lora_rank;
  const int64_t rope = config_.qk_rope_head_dim, width = lora + rope;
  rmsnorm_rows(ctx,
               {.x = s.kv_a.data(),
                .x_stride = width,
                .out = s.kv_a.data(),
                .out_stride = width,
                .rows = t_rows,
                .dim = lora,
                .eps = kLowRankNormEps},
               w.kv_a_norm.data());
  const int64_t half = rope / 2;
  for_row_ranges(ctx, t_rows, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      rope_.rotate(rows.rope_cos.data() + t * half, rows.rope_sin.data() + t * half,
                   s.kv_a.data() + t * width + lora);
    }
  });
  // Distinct tokens write distinct cache rows: the ranges can run at once.
  const int64_t block_size = cache.layout().block_size;
  for (const StepChunk& chunk : rows.chunks) {
    for_row_ranges(ctx, chunk.num_tokens, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t pos = chunk.start_pos + i;
        const float* entry = s.kv_a.data() + (chunk.row_begin + i) * width;
        cache.write_token(kv_layer, chunk.block_table[pos / block_size], pos % block_size,
                          {entry, static_cast<size_t>(lora)},
                          {entry + lora, static_cast<size_t>(rope)});
      }
    });
  }
}

void MlaAttention::attend_plain(const ComputeContext& ctx, const AttentionWeights& w,
                                const StepChunk& chunk, int64_t kv_layer,
                                const LatentKvCache& cache, MlaScratch& s) const {
  const int64_t heads = config_.num_attention_heads, qk = config_.qk_head_dim();
  const int64_t nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int64_t lora = config_.kv_lora_rank, v = config_.v_head_dim, width = lora + rope;
  const int64_t context = chunk.context(), n = chunk.num_tokens, kv_width = heads * (nope + v);

  gather_context(chunk, kv_layer, cache, s);
  // Decompress the whole context: {context, heads * (nope + v)}
  s.kv.resize(context * kv_width);
  linear(ctx, s.ctx.data(), context, w.kv_b, s.kv.data(), /*x_stride=*/width);
  if (ctx.precision == kernels::ActivationPrecision::kBf16 && nope % 2 == 0) {
    attend_plain_packed(ctx, chunk, s);
    return;
  }

  // Keys transposed, so that a tile's scores are weighted sums of key rows like its outputs
  // are of value rows (register-blocked multiply-adds; short dot products over the qk width,
  // each ending in a lane reduction, ran at ~40% of the FMA peak: docs/kernels.md): per head
  // {nope, context} of k_nope, and {rope, context} of k_pe, which all heads share. Values are
  // read in place from s.kv.
  s.keys_t.resize(heads * nope * context);
  s.rope_keys_t.resize(rope * context);
  kernels::transpose(s.ctx.data() + lora, width, context, rope, s.rope_keys_t.data(), context);
  ctx.pool->parallel_for(heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      kernels::transpose(s.kv.data() + h * (nope + v), kv_width, context, nope,
                         s.keys_t.data() + h * nope * context, context);
    }
  });

  const int64_t tiles = (n + kQueryTile - 1) / kQueryTile;
  ctx.pool->parallel_for(heads * tiles, [&](int64_t item0, int64_t item1) {
    thread_local std::vector<float> scores;  // kept between calls: no allocation per layer
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t h = item / tiles, i0 = (item % tiles) * kQueryTile;
      const int64_t i1 = std::min(n, i0 + kQueryTile), rows = i1 - i0;
      const int64_t limit = chunk.start_pos + i1;  // keys visible to the tile's last query
      // scores[r, j] = sum over d of q[r, d] k[j, d]: the nope dims, then the rope dims.
      scores.assign(rows * limit, 0.0f);
      const float* q = s.q.data() + ((chunk.row_begin + i0) * heads + h) * qk;
      kernels::weighted_rows(q, heads * qk, rows, s.keys_t.data() + h * nope * context, context,
                             nope, scores.data(), limit, limit);
      kernels::weighted_rows(q + nope, heads * qk, rows, s.rope_keys_t.data(), context, rope,
                             scores.data(), limit, limit);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = chunk.start_pos + i0 + r + 1;  // causal
        float* row = scores.data() + r * limit;
        kernels::scale(scale_, row, visible);
        kernels::softmax(row, visible);
        std::fill(row + visible, row + limit, 0.0f);
      }
      // attn[r, :] = sum over keys j of p[r, j] v[j, :] (the zeros past `visible` add nothing).
      float* out = s.attn.data() + (chunk.row_begin + i0) * heads * v + h * v;
      for (int64_t r = 0; r < rows; ++r) std::fill_n(out + r * heads * v, v, 0.0f);
      kernels::weighted_rows(scores.data(), limit, rows, s.kv.data() + h * (nope + v) + nope,
                             kv_width, limit, out, heads * v, v);
    }
  });
}

void MlaAttention::attend_plain_packed(const ComputeContext& ctx, const StepChunk& chunk,
                                       MlaScratch& s) const {
  const int64_t heads = config_.num_attention_heads, qk = config_.qk_head_dim();
  const int64_t nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int64_t lora = config_.kv_lora_rank, v = config_.v_head_dim, width = lora + rope;
  const int64_t context = chunk.context(), n = chunk.num_tokens, kv_width = heads * (nope + v);

  // Per head, once: keys [context, qk] (k_nope of the head, then the shared k_pe) and the
  // transposed values [v, context], packed in bf16 for kernels::Bf16Panels products.
  if (static_cast<int64_t>(s.key_panels.size()) < heads) {
    s.key_panels.resize(static_cast<size_t>(heads));
    s.value_panels.resize(static_cast<size_t>(heads));
  }
  ctx.pool->parallel_for(heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      kernels::Bf16Panels& keys = s.key_panels[static_cast<size_t>(h)];
      keys.reset(context, qk);
      keys.fill_rows(s.kv.data() + h * (nope + v), kv_width, 0, nope);
      keys.fill_rows(s.ctx.data() + lora, width, nope, rope);
      kernels::Bf16Panels& values = s.value_panels[static_cast<size_t>(h)];
      values.reset(v, context);
      values.fill_transposed(s.kv.data() + h * (nope + v) + nope, kv_width);
    }
  });

  // Per (head, tile of queries): scores over the keys the tile's last query sees, a causal
  // softmax per query in fp32, then the probabilities (rounded to bf16 like every GEMM
  // input) times the values, written straight into the head's output columns.
  const int64_t tiles = (n + kQueryTile - 1) / kQueryTile;
  const int64_t q_stride = (qk + 1) / 2 * 2;
  ctx.pool->parallel_for(heads * tiles, [&](int64_t item0, int64_t item1) {
    thread_local std::vector<bf16> queries, probs;
    thread_local std::vector<float> scores;
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t h = item / tiles, i0 = (item % tiles) * kQueryTile;
      const int64_t i1 = std::min(n, i0 + kQueryTile), rows = i1 - i0;
      const int64_t limit = chunk.start_pos + i1;  // keys visible to the tile's last query
      const int64_t p_stride = (limit + 1) / 2 * 2;
      queries.resize(static_cast<size_t>(rows * q_stride));
      for (int64_t r = 0; r < rows; ++r) {
        bf16* row = queries.data() + r * q_stride;
        kernels::fp32_to_bf16(s.q.data() + ((chunk.row_begin + i0 + r) * heads + h) * qk, row, qk);
        std::fill(row + qk, row + q_stride, bf16{0});  // the pair's second half of an odd qk
      }
      scores.resize(static_cast<size_t>(rows * limit));
      s.key_panels[static_cast<size_t>(h)].multiply(queries.data(), q_stride, rows, limit, qk,
                                                    scores.data(), limit, false);
      probs.resize(static_cast<size_t>(rows * p_stride));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = chunk.start_pos + i0 + r + 1;  // causal
        float* row = scores.data() + r * limit;
        kernels::scale(scale_, row, visible);
        kernels::softmax(row, visible);
        bf16* p = probs.data() + r * p_stride;
        kernels::fp32_to_bf16(row, p, visible);
        std::fill(p + visible, p + p_stride, bf16{0});
      }
      float* out = s.attn.data() + (chunk.row_begin + i0) * heads * v + h * v;
      s.value_panels[static_cast<size_t>(h)].multiply(probs.data(), p_stride, rows, v, limit, out,
                                                      heads * v, false);
    }
  });
}

void MlaAttention::attend_absorbed(const ComputeContext& ctx, const AttentionWeights& w,
                                   const StepRows& rows, int64_t kv_layer,
                                   const LatentKvCache& cache, MlaScratch& s) const {
  const int64_t heads = config_.num_attention_heads, qk = config_.qk_head_dim();
  const int64_t nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int64_t lora = config_.kv_lora_rank, v = config_.v_head_dim, width = lora + rope;
  const KvLayout& layout = cache.layout();
  const int64_t block_size = layout.block_size;

  std::vector<const StepChunk*>& chunks = s.absorbed_chunks;
  std::vector<int64_t>& first_row = s.absorbed_first_row;  // within the absorbed rows
  chunks.clear();
  first_row.clear();
  int64_t num_rows = 0;
  for (const StepChunk& chunk : rows.chunks) {
    if (!chunk.absorbed || chunk.num_tokens == 0) continue;
    chunks.push_back(&chunk);
    first_row.push_back(num_rows);
    num_rows += chunk.num_tokens;
  }
  if (num_rows == 0) return;

  // {num_rows, heads * qk}: the absorbed chunks' queries, stacked.
  s.q_abs.resize(num_rows * heads * qk);
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::memcpy(s.q_abs.data() + first_row[c] * heads * qk,
                s.q.data() + chunks[c]->row_begin * heads * qk,
                chunks[c]->num_tokens * heads * qk * sizeof(float));
  }
  // {num_rows, heads, lora + rope}: [q_nope W_UK ; q_pe] per head.
  s.q_full.resize(num_rows * heads * width);
  // Per-head products: head h's x block at x + h * x_width of each row, its y block at
  // y + h * y_width. In the packed layout where the model packed W_UK and W_UV (bf16 inputs;
  // at decode these are GEMVs, which the checkpoint-layout kernel runs at well under the
  // packed kernel's bandwidth), else over the checkpoint layout: head h's [n, k] weight at
  // weights + h * w_head, rows w_stride apart.
  const bool packed_heads = !w.w_uk_packed.empty() && !w.w_uv_packed.empty() &&
                            ctx.precision == kernels::ActivationPrecision::kBf16;
  auto packed_per_head =
      [&](const float* x, int64_t x_width,
          std::span<const std::shared_ptr<const kernels::PackedBf16Matrix>> weights, float* y,
          int64_t y_width) {
        std::vector<kernels::MatmulPackedBf16Args>& packed = s.packed_problems;
        packed.assign(heads, {});
        for (int64_t h = 0; h < heads; ++h) {
          packed[h] = {.x = x + h * x_width,
                       .x_stride = heads * x_width,
                       .w = weights[h].get(),
                       .y = y + h * y_width,
                       .y_stride = heads * y_width,
                       .m = num_rows};
        }
        kernels::grouped_matmul_packed_bf16(packed, ctx.pool);
      };
  auto checkpoint_per_head = [&](const float* x, int64_t x_width, const bf16* weights,
                                 int64_t w_head, int64_t w_stride, int64_t n, int64_t k, float* y,
                                 int64_t y_width) {
    std::vector<kernels::MatmulBf16Args>& problems = s.problems;
    problems.assign(heads, {});
    for (int64_t h = 0; h < heads; ++h) {
      problems[h] = {.x = x + h * x_width,
                     .x_stride = heads * x_width,
                     .w = weights + h * w_head,
                     .w_stride = w_stride,
                     .y = y + h * y_width,
                     .y_stride = heads * y_width,
                     .m = num_rows,
                     .n = n,
                     .k = k};
    }
    kernels::grouped_matmul_bf16(problems, ctx.precision, ctx.pool);
  };
  if (packed_heads) {
    packed_per_head(s.q_abs.data(), qk, w.w_uk_packed, s.q_full.data(), width);
  } else {
    PS_CHECK(!w.w_uk_t.empty()) << "absorbed attention: W_UK was packed, and the step's GEMM "
                                   "inputs are not bf16";
    checkpoint_per_head(s.q_abs.data(), qk, w.w_uk_t.data(), lora * nope, nope, lora, nope,
                        s.q_full.data(), width);
  }
  for (int64_t a = 0; a < num_rows * heads; ++a) {
    std::memcpy(s.q_full.data() + a * width + lora, s.q_abs.data() + a * qk + nope,
                rope * sizeof(float));
  }

  // {num_rows, heads, lora}: attention-weighted sums of the cached latents. Every head of a
  // query reads the same latents, so a work item takes a group of heads and reads each cache
  // block once for all of them (scores as one product with a row per head, sums as
  // weighted_rows). Groups are sized so that a small batch still gives every thread work;
  // the bits do not depend on the grouping (each element is summed in one fixed order).
  s.o_lat.assign(num_rows * heads * lora, 0.0f);
  const bool bf16_cache = layout.dtype == DType::kBF16;
  // With bf16 latents and bf16 GEMM inputs, the scores are the packed outer-product form
  // with the roles turned around (kernels/bf16_panels.h): the group's heads are the packed
  // matrix, packed once per query, and each cache block's keys the activation side, read in
  // place; scores come out as [key, head] and are turned to [head, key] for the softmax.
  // Otherwise (fp32 activations: exactness checks; an fp32 cache) one product per block.
  const bool packed_scores = bf16_cache && ctx.precision == kernels::ActivationPrecision::kBf16 &&
                             width % 2 == 0;  // keys are read in pairs, in place
  // Work items per thread: two for balance, but one with packed scores, whose cost per key
  // is that of a whole 16-head panel however few heads a group has (mini, batch 1, context
  // 4,096: 3.81-4.05 -> 3.40-3.58 ms per step, docs/kernels.md).
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  const int64_t items = (packed_scores ? 1 : 2) * ctx.pool->num_threads();
  const int64_t groups_per_chunk =
      std::clamp<int64_t>((items + num_chunks - 1) / num_chunks, 1, heads);
  const int64_t group_heads = (heads + groups_per_chunk - 1) / groups_per_chunk;
  const int64_t groups = (heads + group_heads - 1) / group_heads;
  ctx.pool->parallel_for(num_chunks * groups, [&](int64_t item0, int64_t item1) {
    thread_local std::vector<float> scores;     // kept between calls: no allocation per layer
    thread_local kernels::Bf16Panels panels;    // the group's heads of one query
    thread_local std::vector<float> key_major;  // [key, head of the group]
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t c = item / groups, h0 = (item % groups) * group_heads;
      const int64_t hg = std::min(heads, h0 + group_heads) - h0;
      const StepChunk& chunk = *chunks[c];
      const int64_t context = chunk.context(), n = chunk.num_tokens;
      scores.resize(n * hg * context);  // [query, head of the group, key]
      for (int64_t r = 0; r < n; ++r) {
        const float* q = s.q_full.data() + ((first_row[c] + r) * heads + h0) * width;
        float* p = scores.data() + r * hg * context;
        const int64_t visible = chunk.start_pos + r + 1;  // causal
        if (packed_scores) {
          panels.reset(hg, width);
          panels.fill_rows(q, width, 0, width);
          key_major.resize(visible * hg);
          for (int64_t b = 0; b * block_size < visible; ++b) {
            const int64_t tokens = std::min(block_size, visible - b * block_size);
            const auto* keys =
                reinterpret_cast<const bf16*>(cache.layer_block(kv_layer, chunk.block_table[b]));
            panels.multiply(keys, width, tokens, hg, width, key_major.data() + b * block_size * hg,
                            hg, false);
          }
          kernels::transpose(key_major.data(), hg, visible, hg, p, context);
        } else {
          for (int64_t b = 0; b * block_size < visible; ++b) {
            const int64_t tokens = std::min(block_size, visible - b * block_size);
            const std::byte* block = cache.layer_block(kv_layer, chunk.block_table[b]);
            // The block's rows as keys, in the cache's dtype.
            auto scores_of = [&](auto key_type) {
              using Key = decltype(key_type);
              kernels::MatmulArgs<Key> sa;
              sa.x = q;
              sa.x_stride = width;
              sa.w = reinterpret_cast<const Key*>(block);
              sa.y = p + b * block_size;
              sa.y_stride = context;
              sa.m = hg;
              sa.n = tokens;
              sa.k = width;
              if constexpr (std::is_same_v<Key, bf16>) {
                kernels::matmul_bf16(sa, kernels::ActivationPrecision::kFp32, nullptr);
              } else {
                kernels::matmul_f32(sa, nullptr);
              }
            };
            if (bf16_cache) {
              scores_of(bf16{});
            } else {
              scores_of(float{});
            }
          }
        }
        for (int64_t hh = 0; hh < hg; ++hh) {
          float* row = p + hh * context;
          kernels::scale(scale_, row, visible);
          kernels::softmax(row, visible);
        }
        float* o = s.o_lat.data() + ((first_row[c] + r) * heads + h0) * lora;
        for (int64_t b = 0; b * block_size < visible; ++b) {
          const int64_t tokens = std::min(block_size, visible - b * block_size);
          const std::byte* block = cache.layer_block(kv_layer, chunk.block_table[b]);
          auto sum_into = [&](const auto* latents) {
            kernels::weighted_rows(p + b * block_size, context, hg, latents, width, tokens, o, lora,
                                   lora);
          };
          if (bf16_cache) {
            sum_into(reinterpret_cast<const bf16*>(block));
          } else {
            sum_into(reinterpret_cast<const float*>(block));
          }
        }
      }
    }
  });

  // {num_rows, heads * v}: W_UV per head, then back into the step's rows.
  s.attn_abs.resize(num_rows * heads * v);
  if (packed_heads) {
    packed_per_head(s.o_lat.data(), lora, w.w_uv_packed, s.attn_abs.data(), v);
  } else {
    checkpoint_per_head(s.o_lat.data(), lora, w.kv_b.data + nope * lora, (nope + v) * lora, lora, v,
                        lora, s.attn_abs.data(), v);
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::memcpy(s.attn.data() + chunks[c]->row_begin * heads * v,
                s.attn_abs.data() + first_row[c] * heads * v,
                chunks[c]->num_tokens * heads * v * sizeof(float));
  }
}

}  // namespace peerserve
