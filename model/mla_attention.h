// Multi-head latent attention (MLA) of one decoder layer over the paged latent cache.
//
// Per token: q = q_b(rmsnorm(q_a(x))) (or q_proj(x)), split per head into q_nope and q_pe;
// [c_kv ; k_pe] = kv_a_proj_with_mqa(x), c_kv = rmsnorm(c_kv); q_pe and k_pe are rotated
// (decoupled RoPE). c_kv and k_pe go into the cache; then each chunk attends over its
// whole context read back from the cache, in one of two forms:
//
//   plain:    [k_nope ; v] = kv_b_proj(c_kv) for every context token, then per head
//             softmax(scale * (q_nope k_nope + q_pe k_pe)) v.
//   absorbed: q_lat = W_UK^T q_nope per head (kv_lora_rank wide), then
//             softmax(scale * (q_lat c_kv + q_pe k_pe)) over the cached latents,
//             o_lat = sum p c_kv, and v-out = W_UV o_lat per head.
//
// Both end in o_proj. The absorbed form never decompresses the context, so it wins when few
// queries share a long context (decode); the plain form pays the decompression once and then
// attends in 192/128-wide heads instead of 576/512-wide ones, so it wins for prefill.
#pragma once

#include <cstdint>
#include <vector>

#include "base/scratch_vector.h"
#include "kernels/bf16_panels.h"
#include "kernels/matmul_packed_bf16.h"
#include "kv/latent_kv_cache.h"
#include "model/forward_step.h"
#include "model/model_config.h"
#include "model/model_options.h"
#include "model/rotary_embedding.h"

namespace peerserve {

// FLOP counts of the two forms for `num_tokens` new queries over a context of `context`
// tokens (causal halving ignored: it is the same for both):
//   plain    = context * H * lora * (nope + v) + num_tokens * context * H * (qk + v)
//   absorbed = num_tokens * H * (nope * lora + lora * v) + num_tokens * context * H * (2 * lora +
//   rope)
// kAuto picks absorbed when it is strictly cheaper: every decode step (1 token), and
// short chunks (e.g. verification of a few draft tokens) against long contexts.
bool choose_absorbed_form(const ModelConfig& config, AttentionForm form, int64_t num_tokens,
                          int64_t context);

// The attention's per-step buffers. Owned by the caller (a ForwardState), reused across
// layers and steps; MlaAttention itself holds no mutable state.
struct MlaScratch {
  // Each written in full before it is read, except attn and o_lat (zeroed per step).
  ScratchVector<float> q_a, q, kv_a, ctx, kv, keys_t, rope_keys_t, q_abs, q_full, attn_abs;
  std::vector<float> attn, o_lat;
  std::vector<kernels::Bf16Panels> key_panels, value_panels;  // per head (plain form, bf16)
  std::vector<kernels::MatmulBf16Args> problems;
  std::vector<kernels::MatmulPackedBf16Args> packed_problems;  // per head, packed weights
  std::vector<const StepChunk*> absorbed_chunks;  // the absorbed form's chunks of the step
  std::vector<int64_t> absorbed_first_row;        // of each within the absorbed rows
};

class ReplicatedWeightsBackend;

class MlaAttention {
 public:
  MlaAttention(const ModelConfig& config, const RotaryEmbedding& rope);

  // x_norm: [rows.num_rows, hidden] (after input_layernorm); out: [rows.num_rows, hidden].
  // Writes the rows' latents into cache layer slot `kv_layer` before attending. With
  // `replicated` the projections are offered to it as those of decoder layer `layer`
  // (model/replicated_weights_backend.h); its error (a lost peer) is returned.
  Status forward(const ComputeContext& ctx, const AttentionWeights& w, const StepRows& rows,
                 int64_t kv_layer, const float* x_norm, LatentKvCache& cache, MlaScratch& scratch,
                 float* out, ReplicatedWeightsBackend* replicated = nullptr,
                 int64_t layer = 0) const;

  // The KV part of forward alone: writes the rows' latents into cache layer slot `kv_layer`,
  // the same bits forward writes for them. For rows whose attention output nothing reads (the
  // model's last layer, DeepseekModel::Impl::drop_unreturned_rows).
  void write_latents(const ComputeContext& ctx, const AttentionWeights& w, const StepRows& rows,
                     int64_t kv_layer, const float* x_norm, LatentKvCache& cache,
                     MlaScratch& scratch) const;

 private:
  // kv_a output in s.kv_a -> normed c_kv and rotated k_pe, written into the cache.
  void store_latents(const ComputeContext& ctx, const AttentionWeights& w, const StepRows& rows,
                     int64_t kv_layer, LatentKvCache& cache, MlaScratch& s) const;
  void attend_plain(const ComputeContext& ctx, const AttentionWeights& w, const StepChunk& chunk,
                    int64_t kv_layer, const LatentKvCache& cache, MlaScratch& s) const;
  // The plain form's scores and sums as packed bf16 products (ActivationPrecision::kBf16),
  // after attend_plain has decompressed the context into s.kv.
  void attend_plain_packed(const ComputeContext& ctx, const StepChunk& chunk, MlaScratch& s) const;
  void attend_absorbed(const ComputeContext& ctx, const AttentionWeights& w, const StepRows& rows,
                       int64_t kv_layer, const LatentKvCache& cache, MlaScratch& s) const;
  // Context latents [context, kv_lora_rank + rope] of a chunk as fp32 into s.ctx.
  void gather_context(const StepChunk& chunk, int64_t kv_layer, const LatentKvCache& cache,
                      MlaScratch& s) const;

  const ModelConfig& config_;
  const RotaryEmbedding& rope_;
  float scale_;
};

}  // namespace peerserve
