// FusedDispatch / FusedCombine (CloudMatrix-Infer §4.2.1) over a Communicator window.
//
// Dispatch: each token is converted once (INT8 with a per-token scale, BF16, or FP32 for
// exact checks) and written, with the local expert slots it needs on that rank, straight
// into the receive buffer of every rank that owns one of its experts: one message per
// (token, owner rank), however many of the token's experts that rank holds. Combine: the
// owner writes each (token, expert) output, unweighted, back into the source rank's
// buffer at the position the source chose at dispatch, and the source sums
//   out[t] = 0; for j in 0 .. top_k-1: out[t] += w[t, j] * result(t, j)
// in top-k order with kernels::weighted_sum, the same operations as the single-process backend
// (so FP32 dispatch is bitwise equal to it).
//
// Buffers are sized once, at creation, by eq. 1-2 of the paper:
//   buffer = ranks x max_tokens x msg_size,
//   dispatch: max_tokens = max tokens per rank (a token is one message per owner),
//   combine:  max_tokens = max tokens per rank x min(top_k, experts per rank) (pairs).
// Every buffer exists twice, one per microbatch slot (double buffering), so that two
// microbatches can be in flight. Completion is a flag per (slot, peer) holding the
// slot's step sequence number; every rank writes every flag at every step, zero tokens
// included (a dummy step), so lock-step ranks never wait for a message nobody sends.
//
// Why reuse is safe without more flags: a source starts dispatch n+1 of a slot only after
// its combine n returned, i.e. after every owner sent results n, which an owner does only
// after it read all of dispatch n; an owner writes results n+1 only after dispatch n+1
// from that source arrived, i.e. after the source finished reading results n.
//
// Nothing on the step path allocates: staging, routing records and receive buffers are
// allocated at creation. A rank builds its own messages and results in place, and those for
// each peer in staging laid out like the peer's buffer, sent whole: one memcpy into the
// peer's memory where peers share it (Window::direct), else one put. (fp32 results, copied
// as they are, go straight into a peer's memory where it is shared.)
//
// Protocol per slot and step, on every rank, in this order:
//   dispatch() -> wait_dispatch() -> [received_* / load_activation / stage_result]
//   -> send_results() -> combine()
// Thread-safety: one thread drives an exchange (calls of two slots may interleave).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"
#include "dist/expert_placement.h"
#include "model/expert_backend.h"
#include "tensor/float_convert.h"

namespace peerserve::dist {

enum class DispatchDtype : uint8_t {
  kInt8,  // int8 + fp32 scale per token; BF16 results (the default, as the paper)
  kBf16,  // bf16 tokens; BF16 results
  kFp32,  // fp32 tokens and results: bitwise equal to single-process execution
};
Result<DispatchDtype> parse_dispatch_dtype(std::string_view name);  // int8 | bf16 | fp32
std::string_view dispatch_dtype_name(DispatchDtype dtype);

// A token's hidden state as a dispatch payload: int8 (its scale into *scale), bf16, or the
// fp32 values as they are. `out` holds hidden_size elements of the dtype. What dispatch()
// writes into a token's first message (the others are copies of it).
void encode_token(DispatchDtype dtype, const float* x, int64_t hidden_size, std::byte* out,
                  float* scale);

struct ExchangeShape {
  int num_ranks = 1;
  int max_tokens_per_rank = 0;  // tokens one rank may dispatch in one call
  int64_t hidden_size = 0;
  int top_k = 0;
  int slots_per_rank = 0;  // physical experts per rank (bounds pairs per peer)
  DispatchDtype dtype = DispatchDtype::kInt8;
  // Copy staged messages and results straight into peers' memory where the window allows
  // it (Window::direct: in-process, or MPI ranks on one node) instead of putting them.
  bool direct_stores = true;
};

// The byte layout of the window, from the shape (eq. 1-2). All sizes are multiples of 64.
struct ExchangeLayout {
  static constexpr size_t kAlign = 64;
  static constexpr int kSlots = 2;  // microbatches

  explicit ExchangeLayout(const ExchangeShape& shape);

  // Dispatch message: header (token, entry count, scale, then int32 local_slot[top_k] and
  // int32 pair_slot[top_k]) padded to 64 bytes, then hidden_size elements of the dtype.
  size_t message_header_bytes = 0;
  size_t message_bytes = 0;
  // Combine message: one result row (bf16, or fp32 in exact mode).
  size_t result_bytes = 0;
  int64_t max_pairs_per_peer = 0;  // max_tokens_per_rank x min(top_k, slots_per_rank)
  // Per peer: a 64-byte count header + max_tokens_per_rank messages.
  size_t dispatch_region_bytes = 0;
  // Per peer: max_pairs_per_peer result rows.
  size_t combine_region_bytes = 0;
  size_t dispatch_buffer_bytes = 0;  // ranks x dispatch_region_bytes (eq. 1), per slot
  size_t combine_buffer_bytes = 0;   // ranks x combine_region_bytes (eq. 1), per slot
  size_t slot_bytes = 0;             // flags + both buffers
  size_t window_bytes = 0;           // kSlots x slot_bytes

  size_t dispatch_flag(int slot, int source) const;
  size_t combine_flag(int slot, int owner) const;
  size_t dispatch_region(int slot, int source) const;
  size_t combine_region(int slot, int owner) const;

 private:
  int num_ranks_ = 1;
};

// One received (token, owner) message, viewed in place.
struct ReceivedToken {
  int source = 0;
  int num_entries = 0;
  const int32_t* local_slots = nullptr;  // [num_entries]: expert slot on this rank
  const int32_t* pair_slots = nullptr;   // [num_entries]: where the result goes at the source
  const std::byte* header = nullptr;
  const std::byte* payload = nullptr;
};

class ExpertExchange {
 public:
  // Collective: creates the window on every rank of `comm` (which must outlive the
  // exchange). `timeout` bounds every wait for a peer.
  static Result<std::unique_ptr<ExpertExchange>> create(Communicator& comm,
                                                        const ExchangeShape& shape,
                                                        std::chrono::milliseconds timeout);

  const ExchangeShape& shape() const { return shape_; }
  const ExchangeLayout& layout() const { return layout_; }
  Communicator& communicator() { return comm_; }

  // The step the next dispatches belong to, the same on every rank (the ranks' step
  // agreement): how many ranks bring tokens to it and how many tokens they bring in all.
  // Used to route among EPLB copies (dispatch). Until called (or with 0 ranks), every rank
  // is taken to bring tokens to a small step.
  void set_step(int ranks_with_tokens, int64_t step_tokens);

  // Source side. Routes every (token, j) pair to a copy of its logical expert, converts
  // and writes the tokens into the owners' buffers of `slot`, and signals every rank.
  // The spans of `tokens` must stay valid until combine() of this slot returns.
  Status dispatch(int slot, const RoutedTokens& tokens, const ExpertPlacement& placement);

  // What this rank's most recent dispatch (of either slot) asked of each rank: the distinct
  // physical experts it sent tokens to there (their weights are streamed once per call),
  // and its layer (-1 before the first dispatch, or when that dispatch had more tokens than
  // count_experts_up_to allows: counting costs ~1 ns per pair). Lets work every rank can do
  // (the shared expert) go where the routed experts are fewest.
  struct DispatchLoad {
    int64_t layer = -1;
    std::span<const int32_t> experts_per_rank;  // [num_ranks]
  };
  DispatchLoad last_dispatch_load() const;
  // Count the experts of dispatches of at most this many tokens (default 0: none).
  void count_experts_up_to(int64_t max_tokens);

  // Owner side: waits until every rank's dispatch of this step has arrived.
  Status wait_dispatch(int slot);
  // Whether every rank's dispatch (results == false) or every owner's results (true) of this
  // slot's step have arrived: what wait_dispatch / combine would wait for, looked at once.
  bool arrived(int slot, bool results) const;
  // The messages received from `source` (valid until send_results of this slot).
  int received_tokens(int slot, int source) const;
  int received_pairs(int slot, int source) const;
  int64_t received_layer(int slot, int source) const;  // RoutedTokens::layer at the source
  ReceivedToken received(int slot, int source, int index) const;
  // Converts a received token's hidden state to fp32 (`row` has hidden_size entries).
  void load_activation(const ReceivedToken& token, float* row) const;
  // Stores the expert output `row` (hidden_size fp32) for the source's pair `pair_slot`
  // (this rank's own results, and fp32 ones, in place where the window allows; the others
  // in staging for send_results, which the slots share: a slot's results are sent before
  // the other slot stages any).
  void stage_result(int slot, int source, int32_t pair_slot, const float* row);
  // Sends every staged result of this step back to its source and signals every rank.
  Status send_results(int slot);

  // Source side: waits for every owner's results and writes out[t] in top-k order.
  // `tokens` is the RoutedTokens given to dispatch().
  Status combine(int slot, const RoutedTokens& tokens, std::span<float> out);

  // Use create().
  ExpertExchange(Communicator& comm, const ExchangeShape& shape, std::unique_ptr<Window> window,
                 std::chrono::milliseconds timeout);

 private:
  Status check_tokens(const RoutedTokens& tokens, const ExpertPlacement& placement);
  Status wait_all(int slot, bool results, const char* what);
  // Sends a region built in staging to `peer`: one copy into its memory where the window
  // allows it, else a put.
  Status copy_to_peer(int peer, size_t offset, std::span<const std::byte> bytes);
  // Whether results for `source` are stored in its window as they are made (else staged).
  bool result_in_place(int source) const;

  Communicator& comm_;
  ExchangeShape shape_;
  ExchangeLayout layout_;
  std::unique_ptr<Window> window_;
  std::chrono::milliseconds timeout_;
  uint64_t sequence_[ExchangeLayout::kSlots] = {0, 0};  // step of each slot (1 = first)
  // Source side, per slot: owner rank and result position of each (token, j) pair.
  std::vector<int32_t> pair_owner_[ExchangeLayout::kSlots];
  std::vector<int32_t> pair_position_[ExchangeLayout::kSlots];
  // Each rank's window memory when stores can go there directly, else nullptr.
  std::vector<std::byte*> direct_;
  // Dispatch staging: one region per owner, laid out as in the owner's buffer.
  std::vector<std::byte> dispatch_staging_;
  std::vector<int32_t> staged_tokens_, staged_pairs_;  // per owner
  // Routing among EPLB copies (dispatch): the work given to each rank in this call, in
  // pairs plus kTouchCost per physical expert first used, and which experts are used.
  // kTouchCost: by bandwidth alone, streaming an expert's weights once costs what 2.5-5
  // rows of its product do on a CPU core (mini: 3 MB at ~20 GB/s = 150 us against 3.1
  // MFLOP at 50-100 GFLOP/s; DeepSeek-V3 in INT8 about the same). But the choice is greedy:
  // later tokens even the ranks out anyway, while a split expert's weights stay read twice.
  // Mini EP=2 batch 64 with 16 copies: a cost of 4 measured 0.80-0.97x of no copies, never
  // splitting a used expert 0.92-0.96x. 64 splits nothing at decode sizes and still spreads
  // a hot expert of a long prefill over its copies (64 of a 512-token prefill's 3,072 pairs).
  static constexpr int64_t kTouchCost = 64;
  std::vector<int64_t> rank_cost_;
  // check_tokens: per logical expert, the number of the last token that chose it (grown to
  // the placement's experts on first use).
  std::vector<uint32_t> expert_stamp_;
  uint32_t stamp_ = 0;
  int step_sources_ = 0;     // set_step; 0 = not told (every rank)
  int64_t step_tokens_ = 0;  // set_step
  // [rank * slots_per_rank + slot]: call_stamp_ when the physical expert is used in this
  // dispatch (no clearing per call).
  std::vector<uint32_t> slot_stamp_;
  uint32_t call_stamp_ = 0;
  std::vector<int32_t> experts_per_rank_;  // last_dispatch_load
  int64_t dispatched_layer_ = -1;
  int64_t count_experts_up_to_ = 0;
  // Result staging: one region per source, laid out as in the source's buffer.
  std::vector<std::byte> result_staging_;
  // combine: where one token's results lie (fp32 or bf16 rows).
  std::vector<const float*> combine_rows_f32_;
  std::vector<const bf16*> combine_rows_bf16_;
};

}  // namespace peerserve::dist
