#include "runtime/model_executor.h"

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace peerserve {

int64_t kv_blocks_for_memory(const KvLayout& layout, uint64_t bytes) {
  const uint64_t per_block = layout.block_bytes();
  return per_block == 0 ? 0 : static_cast<int64_t>(bytes / per_block);
}

Result<std::unique_ptr<ModelExecutor>> ModelExecutor::create(DeepseekModel* model,
                                                             const ModelExecutorOptions& options) {
  if (model == nullptr) return invalid_argument("model executor: no model");
  if (options.num_blocks < 1) {
    return invalid_argument("model executor: num_blocks = " + std::to_string(options.num_blocks) +
                            ", expected >= 1 (raise the KV cache memory)");
  }
  if (options.microbatches != 1 && options.microbatches != 2) {
    return invalid_argument("model executor: microbatches = " +
                            std::to_string(options.microbatches) + ", expected 1 or 2");
  }
  const KvLayout layout = model->kv_layout(options.block_size, options.kv_dtype);
  PS_RETURN_IF_ERROR(layout.validate());
  PS_ASSIGN_OR_RETURN(LatentKvCache cache, LatentKvCache::create(layout, options.num_blocks));
  return std::unique_ptr<ModelExecutor>(
      new ModelExecutor(model, std::move(cache), options.microbatches));
}

Result<StepResult> ModelExecutor::execute(const StepPlan& plan) {
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    SequenceChunk chunk;
    chunk.tokens = c.tokens;
    chunk.start_pos = c.start_pos;
    chunk.block_table = c.block_table;
    chunk.all_logits = false;
    chunks.push_back(chunk);
  }
  if (pipeline_) {
    PS_RETURN_IF_ERROR(pipeline_->forward(chunks, cache_, &output_));
  } else {
    PS_RETURN_IF_ERROR(model_->forward(chunks, cache_, *state_, &output_));
  }
  StepResult result;
  result.sampled.resize(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (!c.sample) continue;
    SamplingContext context;
    context.generated = c.generated;
    context.seed = c.seed;
    result.sampled[i] =
        sample_token(output_.last_logits(static_cast<int64_t>(i)), *c.sampling, context);
  }
  return result;
}

Status ModelExecutor::read_kv_block(int32_t block, std::span<std::byte> out) const {
  if (block < 0 || block >= cache_.num_blocks() || out.size() != kv_block_bytes()) {
    return invalid_argument("read_kv_block: block " + std::to_string(block) + " of " +
                            std::to_string(cache_.num_blocks()) + ", " +
                            std::to_string(out.size()) + " bytes for a block of " +
                            std::to_string(kv_block_bytes()));
  }
  std::span<const std::byte> src = cache_.block_bytes(block);
  std::copy(src.begin(), src.end(), out.begin());
  return ok_status();
}

Status ModelExecutor::write_kv_block(int32_t block, std::span<const std::byte> bytes) {
  if (block < 0 || block >= cache_.num_blocks() || bytes.size() != kv_block_bytes()) {
    return invalid_argument("write_kv_block: block " + std::to_string(block) + " of " +
                            std::to_string(cache_.num_blocks()) + ", " +
                            std::to_string(bytes.size()) + " bytes for a block of " +
                            std::to_string(kv_block_bytes()));
  }
  std::span<std::byte> dst = cache_.mutable_block_bytes(block);
  std::copy(bytes.begin(), bytes.end(), dst.begin());
  return ok_status();
}

}  // namespace peerserve
