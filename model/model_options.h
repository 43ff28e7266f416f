// How a DeepseekModel runs: threads, GEMM activation precision, attention form, MTP.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace peerserve {

// Precision of the activations fed to the weight GEMMs (accumulation is always fp32).
enum class GemmPrecision {
  kFp32,  // activations stay fp32: exact up to summation order (tests, reference checks)
  kBf16,  // activations rounded to bf16 at each GEMM input: what bf16 inference does, faster
};

enum class AttentionForm { kAuto, kPlain, kAbsorbed };

enum class WeightQuantization { kNone, kInt8 };

struct ModelOptions {
  // Worker threads for kernels; <= 0 means all hardware threads. Default: 0.
  int num_threads = 0;
  // Default: kBf16 (inference). Use kFp32 for exactness tests.
  GemmPrecision gemm_precision = GemmPrecision::kBf16;
  // Default: kAuto (per chunk, by FLOP count). Forcing a form is for tests and benchmarks.
  AttentionForm attention_form = AttentionForm::kAuto;
  // Load the MTP layer (when the checkpoint has one). Default: true.
  bool load_mtp = true;
  // Which routed experts to load, per MoE layer (the MTP layer is num_hidden_layers): their
  // logical ids, in the order this process's expert backend indexes them, copies of one
  // expert allowed (expert parallelism: this rank's share and its redundant copies). The
  // other experts' tensors are left unread. Default (empty): every expert, in id order.
  std::function<std::vector<int32_t>(int64_t layer)> routed_experts;
  // Called while weights load: bytes done, bytes total. Default: none.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // W8A8 at load time (docs/quantization.md): the linear layers the paper quantizes
  // (attention projections except the absorbed kv_b, dense and expert MLPs) get INT8
  // weights with per-output-channel scales, round to nearest; activations are quantized per
  // token inside the kernels. Norms, the router, embeddings and kv_b stay as loaded.
  // Default: kNone.
  WeightQuantization quantize = WeightQuantization::kNone;
  // With kInt8: the LM head (and the MTP head) too. Default: false.
  bool quantize_lm_head = false;
  // The drafter of speculative decoding — the MTP layer, its eh_proj and its head — in W8A8
  // (round to nearest, the weights `quantize` would pick, plus the head), whatever `quantize`
  // says of the main model: drafts only choose what the main model verifies, so outputs stay
  // those of the main model, and an INT8 drafter reads half the bytes per draft. A head shared
  // with the BF16 LM head gets its own INT8 copy (vocab x hidden bytes). Default: kNone.
  WeightQuantization quantize_draft = WeightQuantization::kNone;
  // Repack the BF16 linear weights at load for the outer-product kernels
  // (model/weight_packing.h) when the GEMM precision is kBf16 and the ISA level has a fast
  // packed kernel (avx512_bf16, avx2): faster prefill and batched decode. The checkpoint's
  // pages are dropped from memory once packed, so resident memory stays about the model's
  // size; the load takes longer (the copy). Default: true.
  bool pack_bf16 = true;
  // In a step's last layer, only the rows whose output the step returns (a chunk's last
  // token, or every token of a chunk asking for all logits or hidden states) run attention,
  // the output projection and the MLP; the others only write their KV. The returned rows
  // come out bitwise the same either way (batch-invariant kernels). Default: true; false
  // for tests that compare.
  bool skip_unreturned_rows = true;
};

}  // namespace peerserve
