// DeepSeek-V3-family decoder (also V2 / V2-Lite / Moonlight variants): the public API.
//
//   auto model = DeepseekModel::load("ckpt/", ModelOptions{});
//   auto cache = LatentKvCache::create((*model)->kv_layout(16, DType::kBF16), num_blocks);
//   ForwardOutput out;
//   Status s = (*model)->forward(chunks, *cache, &out);   // one step of a ragged batch
//
// Attention form (MLA): the plain multi-head form decompresses the cached latents of the
// whole context through kv_b_proj and runs ordinary attention (cheap per query when many
// queries share the context: prefill); the weight-absorbed form folds kv_b_proj's K half
// into the query and its V half into the output and attends directly over the cached
// [c_kv ; k_pe] (cheap for few queries: decode). With AttentionForm::kAuto each chunk
// takes the form with fewer FLOPs for its (new tokens, context length); see
// mla_attention.h. Both give the same result up to float rounding.
//
// Thread-safety: one forward call at a time (the engine thread owns the model); the model
// runs its own thread pool inside a call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "kv/kv_layout.h"
#include "kv/latent_kv_cache.h"
#include "model/forward_batch.h"
#include "model/model_config.h"

namespace peerserve {

class Checkpoint;
class ExpertBackend;

// Precision of the activations fed to the weight GEMMs (accumulation is always fp32).
enum class GemmPrecision {
  kFp32,  // activations stay fp32: exact up to summation order (tests, reference checks)
  kBf16,  // activations rounded to bf16 at each GEMM input: what bf16 inference does, faster
};

enum class AttentionForm { kAuto, kPlain, kAbsorbed };

struct ModelOptions {
  // Worker threads for kernels; <= 0 means all hardware threads. Default: 0.
  int num_threads = 0;
  // Default: kBf16 (inference). Use kFp32 for exactness tests.
  GemmPrecision gemm_precision = GemmPrecision::kBf16;
  // Default: kAuto (per chunk, by FLOP count). Forcing a form is for tests and benchmarks.
  AttentionForm attention_form = AttentionForm::kAuto;
  // Load the MTP layer (when the checkpoint has one). Default: true.
  bool load_mtp = true;
  // Called while weights load: bytes done, bytes total. Default: none.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

class DeepseekModel {
 public:
  // Opens the checkpoint in `dir` (config.json + safetensors) and loads every weight.
  // Errors name the file, tensor and expected shape.
  static Result<std::unique_ptr<DeepseekModel>> load(const std::string& dir,
                                                     const ModelOptions& options);
  // Same, from an already opened checkpoint (weights keep their mapping alive themselves,
  // so the checkpoint may be closed afterwards). Fails if a tensor the model needs is
  // missing or misshaped, or if the checkpoint has tensors the model does not use.
  static Result<std::unique_ptr<DeepseekModel>> from_checkpoint(Checkpoint& checkpoint,
                                                                const ModelOptions& options);

  ~DeepseekModel();
  DeepseekModel(const DeepseekModel&) = delete;
  DeepseekModel& operator=(const DeepseekModel&) = delete;

  const ModelConfig& config() const;
  const ModelOptions& options() const;
  // Whether the MTP layer is loaded (forward_mtp is usable).
  bool has_mtp() const;

  // The cache layout this model needs: num_hidden_layers layer slots, plus one per loaded
  // MTP layer (slot num_hidden_layers).
  KvLayout kv_layout(int64_t block_size, DType dtype) const;

  // One step over a ragged batch; see forward_batch.h. Writes the new tokens' KV into
  // `cache`, then fills *out. Invalid input (empty chunk, token id outside the vocabulary,
  // position beyond max_position_embeddings, block table too short, block id outside the
  // cache, two chunks writing one block, cache layout not matching kv_layout()) returns
  // InvalidArgument/OutOfRange and leaves the cache untouched.
  Status forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache, ForwardOutput* out);

  // One step of the MTP layer (draft-token logits); see MtpChunk. Same validation.
  Status forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache, ForwardOutput* out);

  // The routed-expert executor (default: local execution with grouped GEMMs), and its
  // replacement (e.g. expert parallelism, or a wrapper that observes routing).
  std::shared_ptr<ExpertBackend> expert_backend() const;
  void set_expert_backend(std::shared_ptr<ExpertBackend> backend);

  // Defined in deepseek_model.cc.
  struct Impl;

 private:
  explicit DeepseekModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
