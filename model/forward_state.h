// ForwardState: everything one forward step of DeepseekModel changes, owned by the caller.
//
// The model (weights, config, thread pool) is immutable after load; a step's activations,
// routing results, attention scratch, expert-backend call state and output live here. A
// caller that keeps two states can have two microbatches in flight at once (their stages
// interleaved), and a device backend can later own these buffers.
//
// A step is a small state machine, driven by DeepseekModel (deepseek_model.h):
//
//   begin_forward / begin_forward_mtp        validate, lay out rows, embed   -> kAttention
//   per decoder layer:
//     kAttention     input norm, MLA (writes KV), residual, post-attention norm
//     kDenseMlp      dense layers: MLP, residual                            -> next layer
//     kRoute         MoE layers: fp32 router, top-k selection and weights
//     kDispatch      ExpertBackend::dispatch (EP: tokens leave for their experts' ranks)
//     kSharedExpert  shared experts, while the routed ones are away
//     kExperts       ExpertBackend::compute (this process's experts)
//     kCombine       ExpertBackend::combine + shared + residual              -> next layer
//   kHead            final norm, LM head into the output                    -> kDone
//
// Fields are the model's business: callers create a state with
// DeepseekModel::new_forward_state, pass it to the model, and read stage() / layer().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/scratch_vector.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_weights.h"
#include "model/expert_backend.h"
#include "model/forward_batch.h"
#include "model/forward_step.h"
#include "model/mla_attention.h"

namespace peerserve {

enum class ForwardStage : uint8_t {
  kIdle,  // no step begun (or the last one's output was taken)
  kAttention,
  kDenseMlp,
  kRoute,
  kDispatch,
  kSharedExpert,
  kExperts,
  kCombine,
  kHead,
  kDone,  // output ready
};

const char* forward_stage_name(ForwardStage stage);

// What the stages need from a SequenceChunk or an MtpChunk.
struct ChunkView {
  std::span<const int32_t> tokens;
  int64_t start_pos = 0;
  std::span<const int32_t> block_table;
  bool all_logits = false;
  bool all_hidden = false;
  bool kv_only = false;      // MtpChunk::kv_only: nothing is returned
  bool decode_form = false;  // SequenceChunk::decode_form

  // Of n new tokens, how many rows of logits and of hidden states the step returns.
  int64_t logits_rows(int64_t n) const { return kv_only ? 0 : all_logits ? n : 1; }
  int64_t hidden_rows(int64_t n) const { return kv_only ? 0 : all_logits || all_hidden ? n : 1; }
};

// One decoder layer of the step's layer list (the main model's layers, or the MTP layer).
struct StepLayer {
  const DecoderLayerWeights* weights = nullptr;
  int64_t kv_slot = 0;  // layer slot in the KV cache layout
};

struct ForwardState {
  explicit ForwardState(int slot_in) : slot(slot_in) {}

  ForwardStage stage() const { return current; }
  // Index into the step's layer list of the layer the next stage belongs to.
  int64_t layer() const { return layer_index; }

  // Microbatch slot (0 or 1), handed to the expert backend's call.
  int slot = 0;
  // Set by a caller that interleaves this state's stages with another state's (the
  // microbatch pipeline): the products of replicated weights then run locally, since their
  // collective backend (model/replicated_weights_backend.h) must be called in the same
  // order on every rank.
  bool interleaved = false;
  ForwardStage current = ForwardStage::kIdle;
  int64_t layer_index = 0;

  // The step: its inputs (views into the caller's chunks, valid until the step is done),
  // layers, final norm and head, and the cache it writes.
  std::vector<ChunkView> views;
  std::vector<StepLayer> layers;
  const std::vector<float>* head_norm = nullptr;
  const LinearWeight* head = nullptr;
  LatentKvCache* cache = nullptr;
  StepRows rows;

  // Activations [rows, hidden]: the residual stream, its normed copy, a layer's branch.
  ScratchVector<float> x, x_norm, branch;
  // Dense / shared-expert MLP scratch and the shared experts' output.
  ScratchVector<float> gate, up, shared;
  // Routing: router logits [rows, n_routed], selection scratch (2 x n_routed per part of
  // for_row_ranges), ids and weights [rows, top_k].
  ScratchVector<float> router_logits;
  std::vector<float> route_scratch, route_weights;
  std::vector<int32_t> route_ids;
  // MTP prelude: [rows, 2 * hidden] concat of the normed embedding and hidden state.
  ScratchVector<float> concat;
  ScratchVector<float> head_input;  // logits rows gathered for the LM head (all_hidden chunks)
  // The last layer's rows that only write their KV (DeepseekModel's drop_unreturned_rows),
  // and their normed inputs.
  StepRows kv_only_rows;
  ScratchVector<float> kv_only_x_norm;
  // Their views, the kept rows' views and attention forms (reused: no allocation per step).
  std::vector<ChunkView> kv_only_views, kept_views;
  std::vector<bool> kept_absorbed;
  MlaScratch attention;
  // The expert backend's state of this microbatch, and which backend made it (weak: a
  // backend replaced by a rebalance is not kept alive, and a later one allocated at its
  // address is not mistaken for it, as a raw pointer could be).
  std::unique_ptr<ExpertBackend::Call> expert_call;
  std::weak_ptr<const ExpertBackend> expert_call_owner;

  ForwardOutput output;
};

}  // namespace peerserve
