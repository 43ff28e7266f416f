// Load-time repacking of the BF16 linear weights for the outer-product kernels
// (ModelOptions::pack_bf16, kernels/matmul_packed_bf16.h, docs/kernels.md).
//
// Every linear weight the forward multiplies through linear() / grouped_linear() — attention
// projections (kv_b included: the prefill decompresses the context with it), dense, shared
// and routed expert MLPs, the MTP projection and head, the LM head — that has BF16 data and
// no INT8 form gets a packed copy of the same values. The BF16 views stay: the embedding
// lookup reads them, and products at ActivationPrecision::kFp32 use them. The absorbed
// attention's per-head W_UK and W_UV are packed separately (pack_absorbed_attention_bf16).
#pragma once

#include <functional>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/deepseek_weights.h"
#include "model/model_options.h"

namespace peerserve {

// Adds the packed forms, matrices spread over `pool`'s threads (nullptr: the calling thread).
// `packed`, when set, is called with each weight once its packed form exists (from the
// packing threads): the caller may drop the BF16 data's pages from memory (they stay
// readable, e.g. Checkpoint::release_pages).
Status pack_weights_bf16(DeepseekWeights& weights, ThreadPool* pool,
                         const std::function<void(const LinearWeight&)>& packed = {});
// The absorbed attention's per-head W_UK and W_UV of every layer (the MTP layer too), packed
// (AttentionWeights::w_uk_packed / w_uv_packed): at decode they are GEMVs that the
// checkpoint-layout kernel ran at well under the packed kernel's bandwidth. The packed W_UK
// replaces w_uk_t, which is then freed (a packing model's products take bf16 inputs, so
// nothing reads it). Reads kv_b's BF16 data: call it before pack_weights_bf16 releases those
// pages.
Status pack_absorbed_attention_bf16(DeepseekWeights& weights, const ModelConfig& config,
                                    ThreadPool* pool);
// One weight's packed copy (its BF16 data must be set), on the calling thread.
Status pack_linear_bf16(LinearWeight& w);
// One MLP's gate, up and down (a routed expert read later, e.g. by an expert-parallel rank),
// on the calling thread.
Status pack_mlp_bf16(MlpWeights& mlp);

// Whether a model loaded with `options` packs its BF16 weights on this CPU: asked for, bf16
// activations, and a kernel level where the packed products are the faster ones.
bool packs_bf16_weights(const ModelOptions& options);

}  // namespace peerserve
