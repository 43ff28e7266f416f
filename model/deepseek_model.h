// DeepSeek-V3-family decoder (also V2 / V2-Lite / Moonlight variants): the public API.
//
//   auto model = DeepseekModel::load("ckpt/", ModelOptions{});
//   auto cache = LatentKvCache::create((*model)->kv_layout(16, DType::kBF16), num_blocks);
//   auto state = (*model)->new_forward_state();            // the caller's per-step buffers
//   ForwardOutput out;
//   Status s = (*model)->forward(chunks, *cache, *state, &out);  // one step of a ragged batch
//
// The weights are immutable after load; everything a step changes lives in the caller's
// ForwardState (forward_state.h), and a step can also be run stage by stage
// (begin_forward, run_stage, take_output), so that two microbatches can be interleaved.
//
// Attention form (MLA): the plain multi-head form decompresses the cached latents of the
// whole context through kv_b_proj and runs ordinary attention (cheap per query when many
// queries share the context: prefill); the weight-absorbed form folds kv_b_proj's K half
// into the query and its V half into the output and attends directly over the cached
// [c_kv ; k_pe] (cheap for few queries: decode). With AttentionForm::kAuto each chunk
// takes the form with fewer FLOPs for its (new tokens, context length); see
// mla_attention.h. Both give the same result up to float rounding.
//
// Thread-safety: the model runs its own thread pool inside a stage, so stages (of any
// states) run one at a time; between stages, any number of states may be in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "kv/kv_layout.h"
#include "kv/latent_kv_cache.h"
#include "model/forward_batch.h"
#include "model/forward_state.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace peerserve {

class Checkpoint;
class ExpertBackend;
class ReplicatedWeightsBackend;
struct DecoderLayerWeights;
struct LinearWeight;
struct MlpWeights;

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
  // Whether the MTP layer's projections run in INT8 (an INT8 checkpoint, --quantize int8 or
  // ModelOptions::quantize_draft).
  bool mtp_runs_int8() const;
  // Whether ModelOptions::quantize_draft gave the MTP layer (not only its head) INT8 forms
  // that the loaded weights did not have: its KV then differs from the stored weights'.
  bool draft_layer_requantized() const;

  // The cache layout this model needs: num_hidden_layers layer slots, plus one per loaded
  // MTP layer (slot num_hidden_layers).
  KvLayout kv_layout(int64_t block_size, DType dtype) const;

  // A fresh per-step state for microbatch `slot` (0 or 1); reuse it for every step.
  std::unique_ptr<ForwardState> new_forward_state(int slot = 0) const;

  // One step over a ragged batch; see forward_batch.h. Writes the new tokens' KV into
  // `cache`, then fills *out. Invalid input (empty chunk, token id outside the vocabulary,
  // position beyond max_position_embeddings, block table too short, block id outside the
  // cache, two chunks writing one block, cache layout not matching kv_layout()) returns
  // InvalidArgument/OutOfRange and leaves the cache untouched. An empty step (no chunks)
  // yields no rows; with a collective expert backend it still runs every MoE layer's
  // exchange, so that the other ranks of the group are not left waiting.
  Status forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache, ForwardState& state,
                 ForwardOutput* out);
  // Same with a temporary state (tests and tools; allocates its buffers on every call).
  Status forward(std::span<const SequenceChunk> chunks, LatentKvCache& cache, ForwardOutput* out);

  // One step of the MTP layer (draft-token logits); see MtpChunk. Same validation.
  Status forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache, ForwardState& state,
                     ForwardOutput* out);
  Status forward_mtp(std::span<const MtpChunk> chunks, LatentKvCache& cache, ForwardOutput* out);

  // Staged execution: what forward() does, in pieces (the stages are listed in
  // forward_state.h). begin_* validates (same errors as forward, state untouched on error)
  // and leaves the state at its first stage; the chunks' spans must stay valid until the
  // step is done. run_stage runs the current stage and advances; after kHead the state is
  // kDone and take_output moves the output out and makes the state idle. An error from a
  // stage (an expert backend's peer lost) abandons the step: the state becomes idle and the
  // new tokens' KV slots hold unspecified values.
  Status begin_forward(ForwardState& state, std::span<const SequenceChunk> chunks,
                       LatentKvCache& cache);
  Status begin_forward_mtp(ForwardState& state, std::span<const MtpChunk> chunks,
                           LatentKvCache& cache);
  Status run_stage(ForwardState& state);
  // Drops the state's step (whatever its stage) and makes it idle; the new tokens' KV slots
  // hold unspecified values.
  void abandon(ForwardState& state);
  // The checks begin_forward makes, for a whole step that will run as several microbatches.
  Status validate_forward(std::span<const SequenceChunk> chunks, const LatentKvCache& cache) const;
  // Runs stages until the state's next stage is `stop` (or it is done).
  Status run_until(ForwardState& state, ForwardStage stop);
  void take_output(ForwardState& state, ForwardOutput* out);

  // The routed experts this process holds at decoder layer `layer` (the MTP layer is
  // num_hidden_layers), in the order of ModelOptions::routed_experts (all, in id order, by
  // default); empty for dense layers. Valid as long as the model.
  std::span<const MlpWeights> held_experts(int64_t layer) const;

  // Gives a routed expert of `layer` read from the checkpoint after load (an
  // expert-parallel rank's own experts) the forms the model gave its own weights: INT8 with
  // ModelOptions::quantize, and in the MTP layer (layer num_hidden_layers) with
  // ModelOptions::quantize_draft too; the packed BF16 copy where the model packs.
  Status prepare_routed_expert(int64_t layer, MlpWeights& expert) const;

  // The routed-expert executor (default: local execution with grouped GEMMs), and its
  // replacement (e.g. expert parallelism, or a wrapper that observes routing).
  std::shared_ptr<ExpertBackend> expert_backend() const;
  void set_expert_backend(std::shared_ptr<ExpertBackend> backend);

  // The weights of decoder layer `layer` of the main model (not the MTP layer), or nullptr.
  // Valid as long as the model.
  const DecoderLayerWeights* decoder_layer(int64_t layer) const;
  // The main model's LM head. Valid as long as the model.
  const LinearWeight* lm_head() const;
  // How the products of the weights every process holds whole (attention projections, dense
  // MLPs, shared experts) run (model/replicated_weights_backend.h); nullptr (the default)
  // runs them here. Set it between steps.
  void set_replicated_weights_backend(std::shared_ptr<ReplicatedWeightsBackend> backend);

  // Defined in deepseek_model.cc.
  struct Impl;

 private:
  explicit DeepseekModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
