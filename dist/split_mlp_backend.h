// ReplicatedMlpBackend over expert parallelism: the dense MLPs and shared experts split
// over the ranks (tensor parallel) while every rank brings few tokens.
//
// Attention is data-parallel, so at batch 1 the rank that owns the request streams the
// dense and shared-expert weights alone while its peers wait at the next MoE exchange
// (docs/forward_stages.md measured it). With the split, each rank holds a slice of every
// such MLP: rows [r I/N, (r+1) I/N) of gate and up and rows [r H/N, (r+1) H/N) of down
// (I: intermediate size, H: hidden size, N: ranks). One call, three all-gathers:
//
//   gather 1   every rank's row count and, when it is within the limit, its rows of x;
//              a rank over the limit makes every rank decline (run locally), the same
//              answer everywhere;
//   gate/up    this rank's slice for all T gathered rows, SiLU(gate) * up: [T, I/N];
//   gather 2   the slices: every rank assembles the whole [T, I] intermediate;
//   down       this rank's output columns for all rows: [T, H/N];
//   gather 3   the column blocks; each rank keeps its own rows.
//
// The gathers go through a Communicator window (stores straight into the peers' memory
// where they share it, puts elsewhere) with a flag per (gather, source) holding the call's
// sequence number, as the expert exchange does: a peer that does not deliver is named in
// the error. Reuse is safe without acknowledgements: gather 1 alternates between two
// buffers (a declined call ends after it), and a rank writes a peer's gather 2 or 3 buffer
// again only after that peer sent it gather 3 of the previous split call, which it does
// after reading both.
//
// Every output element is computed by the kernel the single process uses, on the same
// inputs, in the same order (the products are row-wise batch-invariant and each output
// column depends only on its weight row), so the result is bitwise that of run_mlp.
// Checked by tests/dist/split_mlp_backend_test.cc and, end to end, tests/ep/ep_cli_test.py.
//
// Layers whose MLP has an INT8 form, or whose sizes the ranks do not divide, are not split
// (every rank declines them alike). Buffers are allocated at creation; a call allocates
// nothing. One thread drives the backend; calls must not interleave (ForwardState::interleaved).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"
#include "model/deepseek_weights.h"
#include "model/replicated_mlp_backend.h"

namespace peerserve::dist {

struct SplitMlpBackendOptions {
  Communicator* communicator = nullptr;  // must outlive the backend
  // [decoder layer] -> that layer's dense MLP or shared expert (nullptr if none); the
  // weights must outlive the backend.
  std::vector<const MlpWeights*> mlps_by_layer;
  int64_t hidden_size = 0;
  // Split a call only when no rank brings more rows than this (0: never split).
  int max_rows_per_rank = 0;
  std::chrono::milliseconds peer_timeout{60000};
};

class SplitMlpBackend final : public ReplicatedMlpBackend {
 public:
  // Slices (and packs, where the whole weight is packed) this rank's share of each MLP.
  // Collective when any layer is split (creates the window; the same on every rank, as
  // the weights are). Errors name the layer whose weights do not fit hidden_size.
  static Result<std::unique_ptr<SplitMlpBackend>> create(SplitMlpBackendOptions options);

  Result<bool> run(const ComputeContext& ctx, int64_t layer, const float* x, int64_t rows,
                   float* out) override;

  // Calls split so far (every rank counts the same).
  int64_t split_calls() const { return split_calls_; }
  // Layers whose MLP this backend splits.
  int split_layers() const;

  struct Slice {
    MlpWeights mlp;  // gate/up: [I/N, H], down: [H/N, I]
    int64_t inter = 0;
  };

  // Use create().
  SplitMlpBackend(SplitMlpBackendOptions options, std::vector<std::optional<Slice>> slices,
                  int64_t max_part);
  Status init_window();

 private:
  static constexpr int kGathers = 4;  // gather 1 (two buffers), gather 2, gather 3
  // Writes `mine` into buffer `gather` of every rank (at this rank's place), signals, and
  // waits until every rank's contribution has arrived here.
  Status all_gather(int gather, std::span<const std::byte> mine, const char* what);
  const std::byte* received(int gather, int source) const;

  SplitMlpBackendOptions options_;
  std::vector<std::optional<Slice>> slices_;  // [decoder layer]; empty: not split
  int ranks_ = 1;
  int64_t max_part_ = 0;  // largest I/N
  std::unique_ptr<Window> window_;
  std::vector<std::byte*> direct_;       // each rank's window memory, or nullptr
  size_t gather_bytes_[kGathers] = {};   // per source
  size_t gather_offset_[kGathers] = {};  // in the window
  uint64_t sequence_ = 0;                // calls so far
  std::vector<std::byte> send_;          // gather 1: row count + rows of x
  std::vector<int64_t> counts_;          // [N] rows of each rank in this call
  std::vector<float> x_all_;             // [T, H]
  std::vector<float> gate_, up_;         // [T, I/N]
  std::vector<float> inter_;             // [T, I]
  std::vector<float> down_;              // [T, H/N]
  int64_t split_calls_ = 0;
};

}  // namespace peerserve::dist
