// ReplicatedWeightsBackend over expert parallelism: the attention projections, dense MLPs,
// shared experts and the LM head split over the ranks (tensor parallel) while every rank
// brings few rows.
//
// Attention is data-parallel, so at batch 1 the rank that owns the request streams these
// weights alone while its peers wait at the next MoE exchange (docs/expert_parallelism.md
// measured it). With the split, each rank holds a slice of each such weight: rows [r W/N,
// (r+1) W/N) of every [W, K] matrix (N ranks), i.e. 1/N of its output columns. A product
// y = x W^T becomes
//
//   gather rows     every rank's row count and, when it is within the limit, its rows of x;
//                   a rank over the limit makes every rank decline (the model runs the
//                   product locally), the same answer everywhere;
//   local columns   this rank's output columns for all T gathered rows: [T, W/N];
//   gather columns  the column blocks; each rank keeps its own rows.
//
// The projections q_a (or q_proj) and kv_a share one gather each way; an MLP gathers its
// rows once, computes its gate/up columns and SiLU locally, gathers the whole [T, I]
// intermediate to every rank, and splits down the same way (three gathers).
//
// Every output element is computed by the kernel the single process uses, on the same
// inputs, in the same order (the products are row-wise batch-invariant and each output
// column depends only on its weight row), so the results are bitwise those of one process.
// Checked by tests/dist/tensor_parallel_backend_test.cc and, end to end,
// tests/ep/ep_cli_test.py.
//
// The gathers go through a Communicator window (stores straight into the peers' memory
// where they share it, puts elsewhere) with a flag per (gather buffer, source) holding the
// gather's sequence number, as the expert exchange does: a peer that does not deliver is
// named in the error. Reuse is safe without acknowledgements: row gathers alternate between
// two buffers and column gathers between two others, and every rank reads what a gather
// brought before it contributes to the next gather of its kind; so a rank that writes a
// buffer for gather k + 2 has seen every peer's part of gather k + 1, sent after that peer
// finished reading gather k.
//
// The shared expert of an MoE layer runs after that layer's dispatch, whose routing makes
// some ranks stream more routed experts than others (at batch 1 a token's 6 experts split
// 3-3 over 2 ranks only a third of the time). Each rank puts into its row gather how many
// distinct routed experts its dispatch sent to each rank (options.routed_experts); every
// rank sums the same numbers and, when that pays (shared_expert_rank), the rank with the
// fewest runs the whole shared expert on the gathered rows and the others take their rows
// from its column gather; otherwise the shared expert splits evenly as above. Nobody waits
// for that gather in run_mlp: the other ranks go on with their routed experts, and
// finish_mlp (before the model's combine reads the output) takes the rows. The whole
// product uses the layer's full weights with the kernels the single process uses, so the
// results are the same bits either way.
//
// Weights with an INT8 form, and weights whose output width the ranks do not divide, are
// not split (every rank declines them alike). Buffers are allocated at creation; a call
// allocates nothing. One thread drives the backend; calls must not interleave
// (ForwardState::interleaved).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"
#include "model/deepseek_weights.h"
#include "model/replicated_weights_backend.h"

namespace peerserve::dist {

// The replicated weights of one decoder layer (nullptr: absent).
struct ReplicatedLayerWeights {
  const MlpWeights* mlp = nullptr;  // the dense MLP or shared expert
  bool shared_expert = false;       // mlp is an MoE layer's shared expert
  const AttentionWeights* attention = nullptr;
};

struct TensorParallelOptions {
  Communicator* communicator = nullptr;  // must outlive the backend
  // [decoder layer]; the weights must outlive the backend.
  std::vector<ReplicatedLayerWeights> layers;
  const LinearWeight* lm_head = nullptr;  // the main model's; nullptr: not split
  int64_t hidden_size = 0;
  // Split a call only when no rank brings more rows than this (0: never split).
  int max_rows_per_rank = 0;
  // For the shared experts' placement: fills the distinct routed experts this rank's last
  // dispatch of `layer` sent to each rank ([ranks]) and returns true, or returns false when
  // it has none for that layer. Null: shared experts always split evenly.
  std::function<bool(int64_t layer, std::span<int32_t> experts_per_rank)> routed_experts;
  // A routed expert's intermediate width: a shared expert of width I counts as I / this
  // many routed experts (0: shared experts always split evenly).
  int64_t routed_intermediate = 0;
  std::chrono::milliseconds peer_timeout{60000};
  // create() refuses buffers (this rank's scratch and its share of the window) larger than
  // this, ResourceExhausted with the size: they grow with max_rows_per_rank x ranks x the
  // widest output slice (the LM head's vocab / ranks). 0: no bound.
  double max_buffer_bytes = 0;
};

class TensorParallelBackend final : public ReplicatedWeightsBackend {
 public:
  // Slices (and packs, where the whole weight is packed) this rank's share of each weight.
  // Collective when anything is split (creates the window; the same on every rank, as the
  // weights are). Errors name the layer whose MLP does not fit hidden_size.
  static Result<std::unique_ptr<TensorParallelBackend>> create(TensorParallelOptions options);

  Result<bool> run_mlp(const ComputeContext& ctx, int64_t layer, const float* x, int64_t rows,
                       float* out) override;
  Result<bool> run_projection(const ComputeContext& ctx, int64_t layer, ReplicatedProjection which,
                              const float* x, int64_t rows, std::span<float* const> out) override;
  Status finish_mlp() override;

  // Calls split so far (every rank counts the same), and of those the shared-expert calls
  // run whole on one rank.
  int64_t split_calls() const { return split_calls_; }
  int64_t whole_shared_calls() const { return whole_shared_calls_; }

  // The rank that should run a whole shared expert of `shared_units` routed experts' work,
  // given the routed experts each rank streams in this step, or -1 for an even split: the
  // rank with the fewest (the first on ties) when its load plus the whole shared expert
  // stays below the heaviest rank's load plus an even share.
  static int shared_expert_rank(std::span<const int64_t> routed, double shared_units);
  // Layers with at least one weight split.
  int split_layers() const;
  bool splits_lm_head() const { return head_.has_value(); }

  struct MlpSlice {
    MlpWeights mlp;  // gate/up: [I/N, H], down: [H/N, I]
    int64_t inter = 0;
  };
  // This rank's slices of the weights of one product (up to two sharing an input).
  struct ProjectionSlice {
    std::vector<LinearWeight> weights;  // [W_j/N, K]
    int64_t input_width = 0;            // K
  };
  struct LayerSlices {
    std::optional<MlpSlice> mlp;
    std::array<std::optional<ProjectionSlice>, 3> projections;  // by ReplicatedProjection
  };

  // Use create(). The constructor sizes the buffers; allocate() makes them.
  TensorParallelBackend(TensorParallelOptions options, std::vector<LayerSlices> slices,
                        std::optional<ProjectionSlice> head);
  // Bytes of the buffers allocate() makes (in double: a huge max_rows_per_rank must not wrap).
  double buffer_bytes() const;
  void allocate();
  Status init_window();

 private:
  // Buffers 0 and 1 take the row gathers, 2 and 3 the column gathers, alternately.
  static constexpr int kBuffers = 4;

  // Gather rows: x [rows, cols] of every rank into x_all_ [total_, cols]; false when a
  // rank brings more than the limit (every rank alike). Sets total_ and mine_.
  // With `loads` (one per rank), every rank's are summed into routed_total_ (all ranks must
  // send them, else routed_known_ is false).
  Result<bool> gather_rows(const float* x, int64_t rows, int64_t cols,
                           std::span<const int32_t> loads = {});
  // A shared expert on the gathered rows, computed whole on rank `whole`; posts its column
  // gather and leaves the rows to finish_mlp.
  Status run_whole_mlp(const ComputeContext& ctx, const MlpWeights& w, int whole, int64_t rows,
                       float* out);
  // Gather columns: local [total_, width] of every rank; returns the buffer where rank r's
  // block is at received(buffer, r).
  Result<int> gather_columns(const float* local, int64_t width, const char* what);
  // Writes `mine` into `buffer` of every rank (at this rank's place), signals `sequence`
  // (the gather's number among those of its kind: flags only grow), and waits until every
  // rank's contribution has arrived here (post_gather, then wait_gather).
  Status all_gather(int buffer, uint64_t sequence, std::span<const std::byte> mine,
                    const char* what);
  Status post_gather(int buffer, uint64_t sequence, std::span<const std::byte> mine);
  Status wait_gather(int buffer, uint64_t sequence, const char* what);
  // out[i, r * part + c] = rank r's block [mine_ + i, offset + c] of a column gather, for
  // this rank's `rows` rows (out has part * ranks columns).
  void copy_own_rows(int buffer, int64_t rows, int64_t width, int64_t offset, int64_t part,
                     float* out) const;
  const std::byte* received(int buffer, int source) const;
  const float* received_floats(int buffer, int source) const {
    return reinterpret_cast<const float*>(received(buffer, source));
  }

  TensorParallelOptions options_;
  std::vector<LayerSlices> slices_;  // [decoder layer]
  std::optional<ProjectionSlice> head_;
  int ranks_ = 1;
  int64_t max_input_ = 0, max_local_ = 0, max_inter_ = 0, max_up_ = 0;  // widths the buffers hold
  std::unique_ptr<Window> window_;
  std::vector<std::byte*> direct_;                 // each rank's window memory, or nullptr
  size_t buffer_bytes_[kBuffers] = {};             // per source
  size_t buffer_offset_[kBuffers] = {};            // in the window
  uint64_t row_gathers_ = 0, column_gathers_ = 0;  // so far
  std::vector<std::byte> send_;                    // a row gather: row count + rows
  std::vector<int64_t> counts_;                    // [N] rows of each rank in this gather
  int64_t total_ = 0, mine_ = 0;                   // rows gathered; this rank's first
  std::vector<float> x_all_;                       // [T, K]
  std::vector<float> local_, up_;                  // [T, this rank's columns]
  std::vector<float> inter_;                       // [T, I]
  std::vector<int32_t> loads_;                     // [N] routed experts of this rank's dispatch
  std::vector<int64_t> routed_total_;              // [N] summed over the ranks' row gathers
  bool routed_known_ = false;
  bool balances_shared_ = false;  // some shared expert may run whole on one rank
  // A whole shared expert's column gather, posted by run_mlp and taken by finish_mlp.
  struct PendingMlp {
    int buffer = 0;
    uint64_t sequence = 0;
    int whole = 0;  // the rank that computed it
    int64_t rows = 0;
    float* out = nullptr;
  };
  std::optional<PendingMlp> pending_;
  int64_t split_calls_ = 0, whole_shared_calls_ = 0;
};

}  // namespace peerserve::dist
