// Load-time W8A8 quantization of a loaded model (ModelOptions::quantize, docs/quantization.md).
//
// Which weights: the linear layers paper 000 §4.5 runs in INT8 — attention q_a / q_b /
// q_proj, kv_a, o_proj; dense MLP and shared/routed expert gate, up, down (gate and up only
// packed together, the fused kernel's form) — get an INT8 form (per output channel, round to
// nearest) that replaces the BF16 one, as in an INT8 checkpoint. kv_b stays BF16 (the
// absorbed attention uses its per-head slices), and so do norms, the router and the
// embeddings; the LM head (and the MTP head) only with `lm_head`. quantize_mlp_int8 (routed
// experts loaded later, under --ep) adds the INT8 form and keeps the BF16 one.
#pragma once

#include <functional>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/deepseek_weights.h"

namespace peerserve {

// Adds the INT8 forms, matrices spread over `pool`'s threads (nullptr: the calling thread);
// InvalidArgument for a weight the kernels cannot take (k too large), naming it. `quantized`
// is called for each weight that got an INT8 form, once its group (a layer) is done: the
// caller may release the BF16 pages (a later read of them faults them in again). Then the
// weight's BF16 form is dropped (data null, storage released: the kernels read the INT8
// form, as for an INT8 checkpoint). An MTP head that shares the LM head's values shares its
// INT8 form too.
Status quantize_weights_int8(DeepseekWeights& weights, bool lm_head, ThreadPool* pool = nullptr,
                             const std::function<void(const LinearWeight&)>& quantized = {});
// The MTP layer's weights as quantize_weights_int8 takes them, plus its eh_proj and its head
// (ModelOptions::quantize_draft); nothing without an MTP layer, and weights with an INT8 form
// already are kept. `quantized` hears of each weight whose BF16 form only the MTP layer read
// (not of a head shared with the LM head or the embeddings, whose BF16 form those still use).
// True when a weight other than the head got a new INT8 form: the MTP layer then writes
// other KV than the loaded weights would (false, e.g., for an INT8 checkpoint's MTP layer).
Result<bool> quantize_draft_int8(DeepseekWeights& weights, ThreadPool* pool = nullptr,
                                 const std::function<void(const LinearWeight&)>& quantized = {});
// One MLP (a routed expert loaded later, e.g. by an expert rebalance).
Status quantize_mlp_int8(MlpWeights& mlp);

}  // namespace peerserve
