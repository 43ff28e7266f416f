// ModelExecutor: runs a StepPlan on the DeepSeek model: one ragged-batch forward over the
// planned chunks into the paged latent KV cache, then the sampler on the last logits of
// every chunk that ends its sequence's known tokens.
//
// Thread-safety: one execute() at a time (the engine thread).
#pragma once

#include <memory>

#include "base/status.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/executor.h"
#include "runtime/microbatch_pipeline.h"

namespace peerserve {

struct ModelExecutorOptions {
  int64_t block_size = 16;        // tokens per KV block. Default 16.
  int64_t num_blocks = 0;         // KV blocks to allocate; >= 1.
  DType kv_dtype = DType::kBF16;  // kBF16 (default) or kF32 (exactness tests).
  // 1: each step is one forward; 2: the two-microbatch pipeline (microbatch_pipeline.h).
  // Default 1.
  int microbatches = 1;
};

// Blocks of `layout` that fit in `bytes` (0 if not even one).
int64_t kv_blocks_for_memory(const KvLayout& layout, uint64_t bytes);

class ModelExecutor final : public Executor {
 public:
  // The model must outlive the executor.
  static Result<std::unique_ptr<ModelExecutor>> create(DeepseekModel* model,
                                                       const ModelExecutorOptions& options);

  Result<StepResult> execute(const StepPlan& plan) override;
  size_t kv_block_bytes() const override { return cache_.layout().block_bytes(); }
  int64_t kv_block_tokens() const override { return cache_.layout().block_size; }
  Status read_kv_block(int32_t block, std::span<std::byte> out) const override;
  Status write_kv_block(int32_t block, std::span<const std::byte> bytes) override;

  const LatentKvCache& kv_cache() const { return cache_; }
  // Null with one microbatch.
  const MicrobatchPipeline* pipeline() const { return pipeline_.get(); }

 private:
  ModelExecutor(DeepseekModel* model, LatentKvCache cache, int microbatches)
      : model_(model),
        cache_(std::move(cache)),
        state_(model->new_forward_state()),
        pipeline_(microbatches == 2 ? std::make_unique<MicrobatchPipeline>(model) : nullptr) {}

  DeepseekModel* model_;
  LatentKvCache cache_;
  std::unique_ptr<ForwardState> state_;  // the step's buffers, reused across steps
  std::unique_ptr<MicrobatchPipeline> pipeline_;
  ForwardOutput output_;  // reused across steps
};

}  // namespace peerserve
