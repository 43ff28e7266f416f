#include "runtime/model_executor.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "model/expert_backend.h"
#include "runtime/sampler.h"
#include "runtime/speculative_sampler.h"

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
  if (options.num_speculative_tokens < 0) {
    return invalid_argument("model executor: num_speculative_tokens = " +
                            std::to_string(options.num_speculative_tokens) + ", expected >= 0");
  }
  if (options.num_speculative_tokens > 0) {
    if (!model->has_mtp()) {
      return invalid_argument(
          "speculative decoding (MTP) needs the checkpoint's MTP layer "
          "(num_nextn_predict_layers >= 1, loaded)");
    }
  }
  const KvLayout layout = model->kv_layout(options.block_size, options.kv_dtype);
  PS_RETURN_IF_ERROR(layout.validate());
  PS_ASSIGN_OR_RETURN(LatentKvCache cache, LatentKvCache::create(layout, options.num_blocks));
  return std::unique_ptr<ModelExecutor>(new ModelExecutor(model, std::move(cache), options));
}

Result<StepResult> ModelExecutor::execute(const StepPlan& plan) {
  const bool speculative = num_speculative_tokens_ > 0 && plan.speculative;
  // Under expert parallelism the MTP layer's MoE exchange needs every rank too: a step that
  // does not speculate here (a dummy step) still joins each of its passes, with no rows.
  const bool joins_mtp_passes = num_speculative_tokens_ > 0 && !speculative && lockstep_mtp();
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    if (!speculative && !c.drafts.empty()) {
      return invalid_argument(
          "model executor: a plan with draft tokens, but speculative decoding is off here (the "
          "scheduler and the executor must have the same num_speculative_tokens)");
    }
    SequenceChunk chunk;
    chunk.tokens = c.tokens;
    chunk.start_pos = c.start_pos;
    chunk.block_table = c.block_table;
    // A row per draft to verify and one after them, or per prompt token owing logprobs.
    chunk.all_logits = !c.drafts.empty() || c.prompt_logprobs >= 0;
    chunk.decode_form = !c.drafts.empty();  // the rows of the decode steps they stand for
    chunk.all_hidden = speculative;         // every position feeds the MTP layer
    chunks.push_back(chunk);
  }
  if (pipeline_) {
    PS_RETURN_IF_ERROR(pipeline_->forward(chunks, cache_, &output_));
  } else {
    PS_RETURN_IF_ERROR(model_->forward(chunks, cache_, *state_, &output_));
  }
  StepResult result;
  result.chunks.resize(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    describe_prompt_tokens(plan.chunks[i], static_cast<int64_t>(i), &result.chunks[i]);
  }
  if (speculative) {
    PS_RETURN_IF_ERROR(speculate(plan, &result));
    return result;
  }
  for (int32_t pass = 0; joins_mtp_passes && pass < num_speculative_tokens_; ++pass) {
    PS_RETURN_IF_ERROR(model_->forward_mtp({}, cache_, *state_, &mtp_output_));
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (!c.sample) continue;
    SamplingContext context;
    context.generated = c.generated;
    context.seed = c.seed;
    context.prompt = c.prompt;
    result.chunks[i].tokens.push_back(
        sample_token(output_.last_logits(static_cast<int64_t>(i)), *c.sampling, context));
  }
  return result;
}

void ModelExecutor::describe_prompt_tokens(const ScheduledChunk& c, int64_t index,
                                           ChunkResult* out) const {
  if (c.prompt_logprobs < 0) return;
  // Row j (position start_pos + j) predicts the token at the next position.
  const int64_t prompt_tokens = static_cast<int64_t>(c.prompt.size());
  const int64_t end = std::min(c.start_pos + c.num_known_tokens(), prompt_tokens - 1);
  for (int64_t pos = std::max(c.start_pos, c.prompt_logprobs_from); pos < end; ++pos) {
    const std::span<const float> logits =
        output_.logits_row(output_.row_offsets[index] + (pos - c.start_pos));
    out->prompt_logprobs.push_back(
        describe_prompt_token(logits, c.prompt[static_cast<size_t>(pos + 1)], c.prompt_logprobs));
  }
}

Status ModelExecutor::speculate(const StepPlan& plan, StepResult* result) {
  const int64_t hidden_size = output_.hidden_size;
  const size_t n = plan.chunks.size();
  // Per chunk: the MTP layer's input (the token after each valid position) and the request's
  // tokens so far (generated, accepted, drafted) for the sampler.
  std::vector<std::vector<TokenId>> next_tokens(n);
  std::vector<std::vector<TokenId>> generated(n);
  std::vector<MtpChunk> mtp_chunks;
  mtp_chunks.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    ChunkResult& out = result->chunks[i];
    const int64_t known = c.num_known_tokens();
    std::vector<TokenId>& next = next_tokens[i];
    next.assign(c.tokens.begin() + 1, c.tokens.begin() + known);
    if (c.sample) {
      generated[i].assign(c.generated.begin(), c.generated.end());
      // The last known token's row: the chunk's last row, or the one before its drafts'.
      const int64_t first_row =
          output_.row_offsets[i + 1] - 1 - static_cast<int64_t>(c.drafts.size());
      for (size_t j = 0; j <= c.drafts.size(); ++j) {
        const SamplingContext context{
            .generated = generated[i], .seed = c.seed, .prompt = c.prompt};
        const std::span<const float> logits =
            output_.logits_row(first_row + static_cast<int64_t>(j));
        bool accepted = false;
        if (j < c.drafts.size()) {
          DraftVerdict verdict = verify_draft(logits, *c.sampling, context, c.drafts[j]);
          accepted = verdict.accepted;
          out.tokens.push_back(std::move(verdict.token));
        } else {
          out.tokens.push_back(sample_token(logits, *c.sampling, context));
        }
        generated[i].push_back(out.tokens.back().token);
        next.push_back(out.tokens.back().token);
        if (!accepted) break;
      }
    } else {
      if (c.next_token < 0) {
        return internal_error("speculative step: a prefill chunk without the token after it");
      }
      next.push_back(c.next_token);
    }
    // Valid positions: the known tokens and the accepted drafts, one per entry of `next`.
    const std::span<const float> hidden = output_.sequence_hidden(static_cast<int64_t>(i));
    PS_CHECK_LE(static_cast<int64_t>(next.size()) * hidden_size,
                static_cast<int64_t>(hidden.size()));
    MtpChunk mtp;
    mtp.next_tokens = next;
    mtp.hidden = hidden.first(next.size() * static_cast<size_t>(hidden_size));
    mtp.start_pos = c.start_pos;
    mtp.block_table = c.block_table;
    // A sequence that drafts nothing this step only needs the MTP layer's KV.
    mtp.kv_only = !c.sample || c.num_lookahead < 1;
    mtp_chunks.push_back(mtp);
  }
  // Under lock-step every step runs the MTP layer num_speculative_tokens_ times, whatever
  // this rank drafts (the other ranks' passes need its exchanges); otherwise only as often
  // as some sequence drafts on.
  const bool lockstep = lockstep_mtp();
  if (mtp_chunks.empty() && !lockstep) return ok_status();
  PS_RETURN_IF_ERROR(model_->forward_mtp(mtp_chunks, cache_, *state_, &mtp_output_));
  int32_t passes = 1;

  // Drafts. Chunk i's last MTP position so far, and the MTP hidden state there.
  const int64_t block_size = cache_.layout().block_size;
  const int64_t max_positions = model_->config().max_position_embeddings;
  std::vector<int64_t> last_pos(n);
  std::vector<size_t> row_of(n);
  std::vector<std::vector<float>> mtp_hidden(n);
  std::vector<size_t> drafting;
  for (size_t i = 0; i < n; ++i) {
    if (mtp_chunks[i].kv_only) continue;  // no output row
    last_pos[i] = plan.chunks[i].start_pos + static_cast<int64_t>(next_tokens[i].size()) - 1;
    row_of[i] = drafting.size();  // the kv_only chunks before it returned no row
    drafting.push_back(i);
  }
  while (!drafting.empty() || (lockstep && passes < num_speculative_tokens_)) {
    std::vector<size_t> going_on;
    for (size_t i : drafting) {
      const ScheduledChunk& c = plan.chunks[i];
      ChunkResult& out = result->chunks[i];
      const int64_t row = static_cast<int64_t>(row_of[i]);
      const SamplingContext context{.generated = generated[i], .seed = c.seed, .prompt = c.prompt};
      out.drafts.push_back(propose_draft(mtp_output_.logits_row(row), *c.sampling, context));
      generated[i].push_back(out.drafts.back().token);
      // Another draft runs the MTP layer at the next position, which must have a KV slot.
      const int64_t pos = last_pos[i] + 1;
      if (static_cast<int32_t>(out.drafts.size()) < c.num_lookahead &&
          pos < static_cast<int64_t>(c.block_table.size()) * block_size && pos < max_positions) {
        const std::span<const float> h = mtp_output_.hidden_row(row);
        mtp_hidden[i].assign(h.begin(), h.end());
        going_on.push_back(i);
      }
    }
    drafting = std::move(going_on);
    if (drafting.empty() && (!lockstep || passes >= num_speculative_tokens_)) break;
    PS_CHECK_LT(passes, num_speculative_tokens_);  // num_lookahead <= num_speculative_tokens_
    mtp_chunks.clear();
    for (size_t r = 0; r < drafting.size(); ++r) {
      const size_t i = drafting[r];
      MtpChunk mtp;
      mtp.next_tokens = std::span<const TokenId>(&result->chunks[i].drafts.back().token, 1);
      mtp.hidden = mtp_hidden[i];
      mtp.start_pos = ++last_pos[i];
      mtp.block_table = plan.chunks[i].block_table;
      mtp_chunks.push_back(mtp);
      row_of[i] = r;
    }
    PS_RETURN_IF_ERROR(model_->forward_mtp(mtp_chunks, cache_, *state_, &mtp_output_));
    ++passes;
  }
  return ok_status();
}

Result<std::vector<SpeculativeCost>> ModelExecutor::measure_speculative_costs(
    std::span<const int32_t> batches, int64_t context, int reps) {
  if (!model_->has_mtp()) return invalid_argument("measuring MTP costs needs the MTP layer");
  if (model_->expert_backend()->collective()) {
    // Its steps would need every rank; --speculative auto resolves to off under --ep.
    return invalid_argument(
        "measuring MTP costs runs in one process, not under expert parallelism");
  }
  if (context < 2 || reps < 1) return invalid_argument("context >= 2 and reps >= 1 expected");
  const int64_t block_size = cache_.layout().block_size;
  const int64_t hidden_size = model_->config().hidden_size;
  const int64_t vocab = model_->config().vocab_size;
  const int64_t blocks_per_seq = (context + 2 + block_size - 1) / block_size;
  std::vector<SpeculativeCost> costs;
  for (const int32_t batch : batches) {
    if (batch < 1 || batch * blocks_per_seq > cache_.num_blocks()) break;
    std::vector<std::vector<int32_t>> tokens(batch), tables(batch);
    for (int32_t s = 0; s < batch; ++s) {
      for (int64_t i = 0; i < context + 2; ++i) {
        tokens[s].push_back(static_cast<int32_t>(3 + (i * 7919 + s * 104729) % (vocab - 3)));
      }
      for (int64_t b = 0; b < blocks_per_seq; ++b) {
        tables[s].push_back(static_cast<int32_t>(s * blocks_per_seq + b));
      }
    }
    auto chunks = [&](int64_t start, int64_t n, bool all_logits, bool all_hidden) {
      std::vector<SequenceChunk> out;
      for (int32_t s = 0; s < batch; ++s) {
        out.push_back({.tokens = std::span<const int32_t>(tokens[s]).subspan(start, n),
                       .start_pos = start,
                       .block_table = tables[s],
                       .all_logits = all_logits,
                       .all_hidden = all_hidden});
      }
      return out;
    };
    const std::vector<SequenceChunk> prefill = chunks(0, context, false, true);
    PS_RETURN_IF_ERROR(model_->forward(prefill, cache_, *state_, &output_));
    std::vector<std::vector<float>> hidden(batch);  // positions context - 2, context - 1
    for (int32_t s = 0; s < batch; ++s) {
      const std::span<const float> h = output_.sequence_hidden(s);
      hidden[s].assign(h.end() - 2 * hidden_size, h.end());
    }
    auto mtp_chunks = [&](int64_t n) {
      std::vector<MtpChunk> out;
      for (int32_t s = 0; s < batch; ++s) {
        // Positions context - n .. context - 1, reading the tokens after them.
        out.push_back(
            {.next_tokens = std::span<const int32_t>(tokens[s]).subspan(context - n + 1, n),
             .hidden = std::span<const float>(hidden[s]).last(n * hidden_size),
             .start_pos = context - n,
             .block_table = tables[s]});
      }
      return out;
    };
    std::vector<MtpChunk> mtp_kv_only = mtp_chunks(1);
    for (MtpChunk& c : mtp_kv_only) c.kv_only = true;
    const std::vector<MtpChunk> mtp_two = mtp_chunks(2);
    const std::vector<SequenceChunk> decode = chunks(context - 1, 1, false, false);
    const std::vector<SequenceChunk> verify = chunks(context - 1, 2, true, true);
    auto decode_step = [&] { return model_->forward(decode, cache_, *state_, &output_); };
    auto mtp_kv_only_step = [&] {
      return model_->forward_mtp(mtp_kv_only, cache_, *state_, &mtp_output_);
    };
    auto speculative_step = [&]() -> Status {
      PS_RETURN_IF_ERROR(model_->forward(verify, cache_, *state_, &output_));
      return model_->forward_mtp(mtp_two, cache_, *state_, &mtp_output_);
    };
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point start) {
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    // Per repetition, each kind of step timed right after an untimed one of its kind (a step
    // then runs in the cache state its own kind leaves, as in a run of such steps): a decode
    // step; a decode step and the KV-only MTP pass after it, the pass timed on its own; a
    // verification step and the MTP layer after it (back to back, as the executor runs them:
    // timing the passes in separate runs missed 30% of the cost, because each evicts the
    // other's weights). Interleaved, so that a machine whose speed drifts over the
    // measurement (a shared VM) moves the three alike; the speculative step as its ratio to
    // the decode step of the same repetition. The KV-only pass is timed by itself: as the
    // difference of two noisy step times (5% of a step, within their spread) it came out at
    // -6%..+18% of a decode step from one start to the next, where the pass alone took
    // 4.5-5.5% each time (tiny preset, batch 8 and 32).
    // Last, verification alone after a speculative step, in the cache state a run of
    // speculative steps leaves (the MTP layer's weights read last): what the speculative step
    // costs before any drafting.
    std::vector<double> decode_times, mtp_times, speculative_ratios, verify_ratios;
    for (int r = 0; r < reps; ++r) {
      PS_RETURN_IF_ERROR(decode_step());
      Clock::time_point start = Clock::now();
      PS_RETURN_IF_ERROR(decode_step());
      const double d = since(start);
      PS_RETURN_IF_ERROR(decode_step());
      PS_RETURN_IF_ERROR(mtp_kv_only_step());
      PS_RETURN_IF_ERROR(decode_step());
      start = Clock::now();
      PS_RETURN_IF_ERROR(mtp_kv_only_step());
      mtp_times.push_back(since(start));
      PS_RETURN_IF_ERROR(speculative_step());
      start = Clock::now();
      PS_RETURN_IF_ERROR(speculative_step());
      speculative_ratios.push_back(since(start) / d);
      decode_times.push_back(d);
      start = Clock::now();
      PS_RETURN_IF_ERROR(model_->forward(verify, cache_, *state_, &output_));
      verify_ratios.push_back(since(start) / d);
      PS_RETURN_IF_ERROR(model_->forward_mtp(mtp_two, cache_, *state_, &mtp_output_));
    }
    auto median = [](std::vector<double>& v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    SpeculativeCost cost;
    cost.batch = batch;
    cost.decode_s = median(decode_times);
    cost.decode_mtp_s = cost.decode_s + median(mtp_times);
    cost.speculative_s = cost.decode_s * median(speculative_ratios);
    cost.verify_s = cost.decode_s * median(verify_ratios);
    costs.push_back(cost);
  }
  if (costs.empty()) return invalid_argument("the KV cache holds no measurement batch");
  return costs;
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

std::span<std::byte> ModelExecutor::kv_block_memory(int32_t block) {
  if (block < 0 || block >= cache_.num_blocks()) return {};
  return cache_.mutable_block_bytes(block);
}

}  // namespace peerserve
