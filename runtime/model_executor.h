// ModelExecutor: runs a StepPlan on the DeepSeek model: one ragged-batch forward over the
// planned chunks into the paged latent KV cache, then the sampler on the last logits of
// every chunk that ends its sequence's known tokens.
//
// With speculative decoding (MTP), one step is:
//   1. the main model over every chunk: known tokens, then the sequence's drafts (logits for
//      every row of a chunk with drafts, hidden states for every row of every chunk);
//   2. verification of the drafts in order (speculative_sampler.h), then one sampled token;
//   3. the MTP layer over every position whose KV is now valid (known tokens and accepted
//      drafts), reading the main model's hidden state there and the token after it, which
//      keeps the MTP layer's own KV complete, and drafting from the last position;
//   4. for K > 1, the MTP layer again, autoregressively, on its own hidden state and draft.
// The MTP KV at a rejected or provisional position is rewritten by the next step, which
// starts there.
//
// Thread-safety: one execute() at a time (the engine thread).
#pragma once

#include <memory>

#include "base/status.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/executor.h"
#include "runtime/microbatch_pipeline.h"
#include "runtime/speculative_policy.h"

namespace peerserve {

struct ModelExecutorOptions {
  int64_t block_size = 16;        // tokens per KV block. Default 16.
  int64_t num_blocks = 0;         // KV blocks to allocate; >= 1.
  DType kv_dtype = DType::kBF16;  // kBF16 (default) or kF32 (exactness tests).
  // 1: each step is one forward; 2: the two-microbatch pipeline (microbatch_pipeline.h).
  // Default 1.
  int microbatches = 1;
  // With two: which steps split (measured per step size, or all; microbatch_pipeline.h).
  MicrobatchSplit microbatch_split = MicrobatchSplit::kMeasured;
  // Speculative decoding with the model's MTP layer: drafts per sequence and step (0 = off;
  // the scheduler must be configured with the same number). Needs a model with its MTP
  // layer loaded. With two microbatches the main forward runs as the pipeline's and the MTP
  // layer's passes after it, whole. With a collective expert backend (expert parallelism)
  // every step, a dummy one too, runs the MTP layer exactly this many times, so that the
  // ranks' MoE exchanges stay in lock-step. Default 0.
  int32_t num_speculative_tokens = 0;
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
  std::span<std::byte> kv_block_memory(int32_t block) override;

  // Times a decode step, the MTP layer's KV-only pass after one, and a verification step (2
  // tokens per sequence) followed by the MTP layer (2 positions per sequence) for each batch
  // size, with `context` tokens of context, the three interleaved `reps` times (medians; the
  // speculative step as its ratio to the decode step of the same repetition). The input of
  // decide_speculative_policy(). Needs the MTP layer loaded. Writes
  // KV blocks from block 0 on: call it before serving, while every block is free. Batch
  // sizes whose sequences do not fit the cache are skipped.
  Result<std::vector<SpeculativeCost>> measure_speculative_costs(std::span<const int32_t> batches,
                                                                 int64_t context, int reps);

  const LatentKvCache& kv_cache() const { return cache_; }
  // Null with one microbatch.
  const MicrobatchPipeline* pipeline() const { return pipeline_.get(); }
  // Lock-step callers post its proposal to, and hand it, each agreement (the pointer stays
  // valid for the executor's life).
  MicrobatchPipeline* pipeline() { return pipeline_.get(); }

 private:
  ModelExecutor(DeepseekModel* model, LatentKvCache cache, const ModelExecutorOptions& options)
      : model_(model),
        cache_(std::move(cache)),
        num_speculative_tokens_(options.num_speculative_tokens),
        state_(model->new_forward_state()),
        pipeline_(options.microbatches == 2
                      ? std::make_unique<MicrobatchPipeline>(model, options.microbatch_split)
                      : nullptr) {}

  // Steps 2-4 of a speculative step, after the main forward into output_.
  Status speculate(const StepPlan& plan, StepResult* result);
  // Whether every step must run the MTP layer exactly num_speculative_tokens_ times: its
  // MoE exchange needs every rank (expert parallelism, lock-step).
  bool lockstep_mtp() const { return model_->expert_backend()->collective(); }
  // The prompt logprobs chunk `index` of the step asks for (ScheduledChunk::prompt_logprobs),
  // from the step's logits rows.
  void describe_prompt_tokens(const ScheduledChunk& c, int64_t index, ChunkResult* out) const;

  DeepseekModel* model_;
  LatentKvCache cache_;
  int32_t num_speculative_tokens_;
  std::unique_ptr<ForwardState> state_;  // the step's buffers, reused across steps
  std::unique_ptr<MicrobatchPipeline> pipeline_;
  ForwardOutput output_;  // reused across steps
  ForwardOutput mtp_output_;
};

}  // namespace peerserve
