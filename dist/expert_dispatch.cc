#include "dist/expert_dispatch.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/bf16_convert.h"
#include "kernels/quantize_rows.h"
#include "kernels/vector_ops.h"

namespace peerserve::dist {
namespace {

constexpr size_t kAlign = ExchangeLayout::kAlign;

size_t round_up(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

size_t element_bytes(DispatchDtype dtype) {
  switch (dtype) {
    case DispatchDtype::kInt8:
      return 1;
    case DispatchDtype::kBf16:
      return 2;
    case DispatchDtype::kFp32:
      return 4;
  }
  return 4;
}

// The first 64 bytes of a dispatch region.
struct RegionHeader {
  uint32_t tokens = 0;
  uint32_t pairs = 0;
  uint64_t sequence = 0;
  int64_t layer = 0;  // the source's decoder layer: ranks must be at the same one
};

// Fixed fields at the start of a dispatch message; int32 local_slot[top_k] and
// int32 pair_slot[top_k] follow.
struct MessageFields {
  int32_t token = 0;
  int32_t num_entries = 0;
  float scale = 0.0f;
  int32_t reserved = 0;
};
constexpr size_t kFieldsBytes = sizeof(MessageFields);

}  // namespace

Result<DispatchDtype> parse_dispatch_dtype(std::string_view name) {
  if (name == "int8") return DispatchDtype::kInt8;
  if (name == "bf16") return DispatchDtype::kBf16;
  if (name == "fp32") return DispatchDtype::kFp32;
  return invalid_argument("dispatch dtype '" + std::string(name) +
                          "', expected int8, bf16 or fp32");
}

std::string_view dispatch_dtype_name(DispatchDtype dtype) {
  switch (dtype) {
    case DispatchDtype::kInt8:
      return "int8";
    case DispatchDtype::kBf16:
      return "bf16";
    case DispatchDtype::kFp32:
      return "fp32";
  }
  return "?";
}

void encode_token(DispatchDtype dtype, const float* x, int64_t hidden_size, std::byte* out,
                  float* scale) {
  switch (dtype) {
    case DispatchDtype::kInt8:
      kernels::quantize_rows_int8(x, 1, hidden_size, hidden_size, reinterpret_cast<int8_t*>(out),
                                  scale);
      return;
    case DispatchDtype::kBf16:
      kernels::fp32_to_bf16(x, reinterpret_cast<bf16*>(out), hidden_size);
      return;
    case DispatchDtype::kFp32:
      std::memcpy(out, x, hidden_size * sizeof(float));
      return;
  }
}

ExchangeLayout::ExchangeLayout(const ExchangeShape& shape) : num_ranks_(shape.num_ranks) {
  message_header_bytes = round_up(kFieldsBytes + 2 * sizeof(int32_t) * shape.top_k);
  message_bytes = message_header_bytes + round_up(shape.hidden_size * element_bytes(shape.dtype));
  const size_t result_element = shape.dtype == DispatchDtype::kFp32 ? 4 : 2;
  result_bytes = round_up(shape.hidden_size * result_element);
  max_pairs_per_peer =
      int64_t{shape.max_tokens_per_rank} * std::min(shape.top_k, shape.slots_per_rank);
  dispatch_region_bytes = kAlign + shape.max_tokens_per_rank * message_bytes;
  combine_region_bytes = max_pairs_per_peer * result_bytes;
  dispatch_buffer_bytes = shape.num_ranks * dispatch_region_bytes;
  combine_buffer_bytes = shape.num_ranks * combine_region_bytes;
  slot_bytes = 2 * shape.num_ranks * kAlign + dispatch_buffer_bytes + combine_buffer_bytes;
  window_bytes = kSlots * slot_bytes;
}

size_t ExchangeLayout::dispatch_flag(int slot, int source) const {
  return slot * slot_bytes + source * kAlign;
}
size_t ExchangeLayout::combine_flag(int slot, int owner) const {
  return slot * slot_bytes + (num_ranks_ + owner) * kAlign;
}
size_t ExchangeLayout::dispatch_region(int slot, int source) const {
  return slot * slot_bytes + 2 * num_ranks_ * kAlign + source * dispatch_region_bytes;
}
size_t ExchangeLayout::combine_region(int slot, int owner) const {
  return slot * slot_bytes + 2 * num_ranks_ * kAlign + dispatch_buffer_bytes +
         owner * combine_region_bytes;
}

Result<std::unique_ptr<ExpertExchange>> ExpertExchange::create(Communicator& comm,
                                                               const ExchangeShape& shape,
                                                               std::chrono::milliseconds timeout) {
  if (shape.num_ranks != comm.size()) {
    return invalid_argument("expert exchange for " + std::to_string(shape.num_ranks) +
                            " ranks on a communicator of " + std::to_string(comm.size()));
  }
  if (shape.max_tokens_per_rank < 1 || shape.hidden_size < 1 || shape.top_k < 1 ||
      shape.slots_per_rank < 1) {
    return invalid_argument(
        "expert exchange: max tokens per rank " + std::to_string(shape.max_tokens_per_rank) +
        ", hidden " + std::to_string(shape.hidden_size) + ", top_k " + std::to_string(shape.top_k) +
        ", experts per rank " + std::to_string(shape.slots_per_rank) + "; expected all >= 1");
  }
  const ExchangeLayout layout(shape);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Window> window,
                      comm.create_window(layout.window_bytes, timeout));
  return std::make_unique<ExpertExchange>(comm, shape, std::move(window), timeout);
}

ExpertExchange::ExpertExchange(Communicator& comm, const ExchangeShape& shape,
                               std::unique_ptr<Window> window, std::chrono::milliseconds timeout)
    : comm_(comm),
      shape_(shape),
      layout_(shape),
      window_(std::move(window)),
      timeout_(timeout),
      dispatch_staging_(shape.num_ranks * layout_.dispatch_region_bytes),
      staged_tokens_(shape.num_ranks),
      staged_pairs_(shape.num_ranks),
      rank_cost_(shape.num_ranks),
      slot_stamp_(static_cast<size_t>(shape.num_ranks) * shape.slots_per_rank, 0),
      experts_per_rank_(shape.num_ranks),
      result_staging_(shape.num_ranks * layout_.combine_region_bytes),
      combine_rows_f32_(shape.top_k),
      combine_rows_bf16_(shape.top_k) {
  for (int r = 0; r < shape.num_ranks; ++r) {
    direct_.push_back(shape.direct_stores ? window_->direct(r) : nullptr);
  }
  for (int s = 0; s < ExchangeLayout::kSlots; ++s) {
    pair_owner_[s].resize(int64_t{shape.max_tokens_per_rank} * shape.top_k);
    pair_position_[s].resize(int64_t{shape.max_tokens_per_rank} * shape.top_k);
  }
}

Status ExpertExchange::check_tokens(const RoutedTokens& tokens, const ExpertPlacement& placement) {
  const int64_t n = tokens.num_tokens, k = tokens.top_k;
  if (n < 0 || n > shape_.max_tokens_per_rank) {
    return invalid_argument("expert dispatch: " + std::to_string(n) +
                            " tokens; the exchange buffers hold at most " +
                            std::to_string(shape_.max_tokens_per_rank) + " per rank");
  }
  if (tokens.hidden_size != shape_.hidden_size || k != shape_.top_k) {
    return invalid_argument("expert dispatch: hidden " + std::to_string(tokens.hidden_size) +
                            ", top_k " + std::to_string(k) + "; the exchange was built for " +
                            std::to_string(shape_.hidden_size) + ", " +
                            std::to_string(shape_.top_k));
  }
  if (static_cast<int64_t>(tokens.activations.size()) != n * tokens.hidden_size ||
      static_cast<int64_t>(tokens.expert_ids.size()) != n * k ||
      static_cast<int64_t>(tokens.weights.size()) != n * k) {
    return invalid_argument("expert dispatch: inconsistent sizes for " + std::to_string(n) +
                            " tokens x top " + std::to_string(k));
  }
  if (placement.num_ranks() != shape_.num_ranks ||
      placement.slots_per_rank() > shape_.slots_per_rank) {
    return invalid_argument(
        "expert dispatch: placement over " + std::to_string(placement.num_ranks()) + " ranks x " +
        std::to_string(placement.slots_per_rank()) + " experts does not fit the exchange");
  }
  if (!placement.has_layer(tokens.layer)) {
    return invalid_argument("expert dispatch: layer " + std::to_string(tokens.layer) +
                            " has no routed experts");
  }
  // An expert seen twice in a token: its stamp already holds the token's number (one load
  // and store per pair, not k^2 / 2 comparisons per token).
  const uint32_t num_experts = static_cast<uint32_t>(placement.num_experts());
  if (expert_stamp_.size() < num_experts) expert_stamp_.assign(num_experts, 0);
  if (stamp_ > UINT32_MAX - static_cast<uint32_t>(n)) {
    std::fill(expert_stamp_.begin(), expert_stamp_.end(), 0);
    stamp_ = 0;
  }
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* ids = tokens.expert_ids.data() + t * k;
    const uint32_t stamp = ++stamp_;
    for (int64_t j = 0; j < k; ++j) {
      if (static_cast<uint32_t>(ids[j]) >= num_experts) {
        return invalid_argument("expert dispatch: expert id " + std::to_string(ids[j]) +
                                " outside [0, " + std::to_string(num_experts) + ")");
      }
      if (expert_stamp_[ids[j]] == stamp) {
        return invalid_argument("expert dispatch: token " + std::to_string(t) + " selects expert " +
                                std::to_string(ids[j]) + " twice");
      }
      expert_stamp_[ids[j]] = stamp;
    }
  }
  return ok_status();
}

void ExpertExchange::count_experts_up_to(int64_t max_tokens) {
  count_experts_up_to_ = max_tokens;
}

void ExpertExchange::set_step(int ranks_with_tokens, int64_t step_tokens) {
  step_sources_ = ranks_with_tokens;
  step_tokens_ = step_tokens;
}

Status ExpertExchange::dispatch(int slot, const RoutedTokens& tokens,
                                const ExpertPlacement& placement) {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "slot " << slot;
  PS_RETURN_IF_ERROR(check_tokens(tokens, placement));
  const uint64_t sequence = ++sequence_[slot];
  const int ranks = shape_.num_ranks, me = comm_.rank();
  const int64_t k = tokens.top_k, hidden = tokens.hidden_size;
  std::fill(staged_tokens_.begin(), staged_tokens_.end(), 0);
  std::fill(staged_pairs_.begin(), staged_pairs_.end(), 0);
  const ExpertPlacement::LayerCopies layer = placement.layer_copies(tokens.layer);
  if (layer.replicated) std::fill(rank_cost_.begin(), rank_cost_.end(), 0);
  // A physical expert is used in this call when its stamp is this call's.
  if (++call_stamp_ == 0) {
    std::fill(slot_stamp_.begin(), slot_stamp_.end(), 0);
    call_stamp_ = 1;
  }
  // Which experts are used: for the choice among copies, and for last_dispatch_load.
  const bool count_experts = tokens.num_tokens <= count_experts_up_to_;
  const bool stamp_experts = count_experts || layer.replicated;
  std::fill(experts_per_rank_.begin(), experts_per_rank_.end(), 0);
  dispatched_layer_ = count_experts ? tokens.layer : -1;
  int32_t* owner_of = pair_owner_[slot].data();
  int32_t* position = pair_position_[slot].data();
  const size_t payload_bytes = hidden * element_bytes(shape_.dtype);
  // Where the messages for `owner` are built: in place for this rank, else in staging laid
  // out like the owner's region (sent whole below, see copy_to_peer).
  auto region_of = [&](int owner) {
    return owner == me && direct_[me] != nullptr
               ? direct_[me] + layout_.dispatch_region(slot, me)
               : dispatch_staging_.data() + owner * layout_.dispatch_region_bytes;
  };

  // Each source routes its own tokens, knowing nothing of the others'. Where several ranks
  // bring tokens, balancing each source's pairs (below) picks different copies of the same
  // expert on different sources, and its weights are read on both ranks: mini EP=2 at batch
  // 64 with 16 copies touched 10% more experts per rank than without copies and ran 5-13%
  // slower. So in such a step, unless it is large enough that an expert's pairs outweigh
  // reading its weights (kTouchCost), every source sends an expert's pairs to the one copy
  // the step's sequence number points to (the same on every rank; it rotates the copies'
  // turns over steps). A lone source (batch 1) keeps the balancing, which is what copies
  // are for at decode sizes.
  const int sources = step_sources_ > 0 ? step_sources_ : ranks;
  const bool one_copy_everywhere =
      sources > 1 &&
      (step_sources_ == 0 || step_tokens_ * k < kTouchCost * placement.num_experts());
  for (int64_t t = 0; t < tokens.num_tokens; ++t) {
    const float* x = tokens.activations.data() + t * hidden;
    const int32_t* ids = tokens.expert_ids.data() + t * k;
    // Where each (token, expert) pair goes (position: the expert's slot on the owner,
    // replaced by the result position below). Experts with one copy first; then each
    // replicated expert goes to the copy on the rank with the least work in this call so
    // far, where a pair costs 1 and the first pair of a physical expert kTouchCost more (its
    // weights are streamed once per call however many tokens it gets: at decode sizes,
    // spreading an expert's few tokens over its copies would read its weights twice).
    // Ties go by a rotation with the token index. Copies hold the same weights, so the
    // choice changes no result.
    auto assign = [&](int64_t j, const PhysicalExpert& copy) {
      owner_of[t * k + j] = copy.rank;
      position[t * k + j] = copy.local_slot;
      if (!stamp_experts) return;
      uint32_t& stamp = slot_stamp_[copy.rank * shape_.slots_per_rank + copy.local_slot];
      const bool first_use = stamp != call_stamp_;
      stamp = call_stamp_;
      experts_per_rank_[copy.rank] += first_use;
      if (layer.replicated) rank_cost_[copy.rank] += 1 + (first_use ? kTouchCost : 0);
    };
    for (int64_t j = 0; j < k; ++j) {
      if (layer.begin[ids[j] + 1] - layer.begin[ids[j]] == 1) {
        assign(j, layer.copies[layer.begin[ids[j]]]);
      }
    }
    for (int64_t j = 0; j < k && layer.replicated; ++j) {
      const PhysicalExpert* copies = layer.copies + layer.begin[ids[j]];
      const int64_t n = layer.begin[ids[j] + 1] - layer.begin[ids[j]];
      if (n == 1) continue;
      if (one_copy_everywhere) {
        assign(j, copies[(static_cast<uint64_t>(ids[j]) + sequence) % n]);
        continue;
      }
      const PhysicalExpert* best = nullptr;
      int64_t best_cost = 0;
      for (int64_t c = 0; c < n; ++c) {
        const PhysicalExpert& copy = copies[(t + me + c) % n];
        const bool touched =
            slot_stamp_[copy.rank * shape_.slots_per_rank + copy.local_slot] == call_stamp_;
        const int64_t cost = rank_cost_[copy.rank] + 1 + (touched ? 0 : kTouchCost);
        if (best == nullptr || cost < best_cost) {
          best = &copy;
          best_cost = cost;
        }
      }
      assign(j, *best);
    }
    // The token is converted once, into its first owner's message, and copied from there
    // into the others'. This rank's own message comes first when it is an owner, so the
    // conversion writes lines this rank's window already holds. Which message is built first
    // changes no byte of any message.
    MessageFields fields;
    fields.token = static_cast<int32_t>(t);
    const std::byte* payload = nullptr;  // the first message's, once encoded
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t j = 0; j < k; ++j) {
        const int owner = owner_of[t * k + j];
        if ((owner == me) != (pass == 0)) continue;
        bool first = true;
        for (int64_t i = 0; i < j && first; ++i) first = owner_of[t * k + i] != owner;
        if (!first) continue;
        std::byte* message =
            region_of(owner) + kAlign + staged_tokens_[owner]++ * layout_.message_bytes;
        int32_t* local_slots = reinterpret_cast<int32_t*>(message + kFieldsBytes);
        int32_t* pair_slots = local_slots + k;
        fields.num_entries = 0;
        for (int64_t i = j; i < k; ++i) {
          if (owner_of[t * k + i] != owner) continue;
          local_slots[fields.num_entries] = position[t * k + i];
          pair_slots[fields.num_entries] = staged_pairs_[owner];
          position[t * k + i] = staged_pairs_[owner]++;
          ++fields.num_entries;
        }
        std::byte* message_payload = message + layout_.message_header_bytes;
        if (payload != nullptr) {
          std::memcpy(message_payload, payload, payload_bytes);
        } else {
          encode_token(shape_.dtype, x, hidden, message_payload, &fields.scale);
          payload = message_payload;
        }
        std::memcpy(message, &fields, kFieldsBytes);
      }
    }
  }

  for (int i = 0; i < ranks; ++i) {
    const int owner = (me + i) % ranks;  // start with self, then spread the load
    std::byte* region = region_of(owner);
    RegionHeader header;
    header.tokens = static_cast<uint32_t>(staged_tokens_[owner]);
    header.pairs = static_cast<uint32_t>(staged_pairs_[owner]);
    header.sequence = sequence;
    header.layer = tokens.layer;
    std::memcpy(region, &header, sizeof header);
    if (owner == me && direct_[me] != nullptr) continue;  // built in place
    const size_t bytes = kAlign + staged_tokens_[owner] * layout_.message_bytes;
    PS_RETURN_IF_ERROR(
        copy_to_peer(owner, layout_.dispatch_region(slot, me), std::span(region, bytes)));
  }
  for (int i = 0; i < ranks; ++i) {
    const int owner = (me + i) % ranks;
    PS_RETURN_IF_ERROR(window_->signal(owner, layout_.dispatch_flag(slot, me), sequence));
  }
  return ok_status();
}

Status ExpertExchange::copy_to_peer(int peer, size_t offset, std::span<const std::byte> bytes) {
  if (direct_[peer] == nullptr) return window_->put(peer, offset, bytes);
  // One copy of the whole region rather than a store per row as rows are made: on one node
  // the lines come from the peer's cache (it read them in the previous step), and a large
  // copy takes them over faster than scattered stores do where the two cores are far apart
  // (a VM's slow phase: int8 dispatch 1.2-2.1x and combine 1.3-1.8x faster at 128 tokens
  // per rank), for 11-33% more time where they are close (docs/expert_parallelism.md).
  std::memcpy(direct_[peer] + offset, bytes.data(), bytes.size());
  return ok_status();
}

ExpertExchange::DispatchLoad ExpertExchange::last_dispatch_load() const {
  return {dispatched_layer_, experts_per_rank_};
}

Status ExpertExchange::wait_all(int slot, bool results, const char* what) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  const uint64_t sequence = sequence_[slot];
  for (int peer = 0; peer < shape_.num_ranks; ++peer) {
    const size_t flag =
        results ? layout_.combine_flag(slot, peer) : layout_.dispatch_flag(slot, peer);
    Status status = window_->wait_at_least(flag, sequence, peer, what, deadline);
    if (!status.ok()) {
      return status.with_context("microbatch " + std::to_string(slot) + " step " +
                                 std::to_string(sequence) + " (timeout " +
                                 std::to_string(timeout_.count()) + " ms)");
    }
  }
  return ok_status();
}

bool ExpertExchange::arrived(int slot, bool results) const {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "slot " << slot;
  for (int peer = 0; peer < shape_.num_ranks; ++peer) {
    const size_t flag =
        results ? layout_.combine_flag(slot, peer) : layout_.dispatch_flag(slot, peer);
    if (!window_->reached(flag, sequence_[slot])) return false;
  }
  return true;
}

Status ExpertExchange::wait_dispatch(int slot) {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "slot " << slot;
  PS_RETURN_IF_ERROR(wait_all(slot, false, "its dispatch"));
  for (int source = 0; source < shape_.num_ranks; ++source) {
    RegionHeader header;
    std::memcpy(&header, window_->local().data() + layout_.dispatch_region(slot, source),
                sizeof header);
    if (header.sequence != sequence_[slot] ||
        header.tokens > uint32_t(shape_.max_tokens_per_rank) ||
        header.pairs > uint64_t(layout_.max_pairs_per_peer)) {
      return data_loss("expert dispatch: rank " + std::to_string(source) + " sent step " +
                       std::to_string(header.sequence) + " with " + std::to_string(header.tokens) +
                       " tokens / " + std::to_string(header.pairs) + " pairs, expected step " +
                       std::to_string(sequence_[slot]) + " (ranks out of lock-step?)");
    }
    // Each message's entries index this rank's scratch and the source's result slots: a
    // message that does not add up to its header is refused before anything reads it.
    uint64_t pairs = 0;
    for (uint32_t m = 0; m < header.tokens; ++m) {
      const ReceivedToken token = received(slot, source, static_cast<int>(m));
      bool ok = token.num_entries >= 1 && token.num_entries <= shape_.top_k;
      for (int e = 0; ok && e < token.num_entries; ++e) {
        ok = token.pair_slots[e] >= 0 && uint64_t(token.pair_slots[e]) < header.pairs;
      }
      if (!ok) {
        return data_loss("expert dispatch: rank " + std::to_string(source) + " sent token " +
                         std::to_string(m) + " with " + std::to_string(token.num_entries) +
                         " entries or a result slot outside its " + std::to_string(header.pairs) +
                         " pairs (top " + std::to_string(shape_.top_k) + ")");
      }
      pairs += static_cast<uint64_t>(token.num_entries);
    }
    if (pairs != header.pairs) {
      return data_loss("expert dispatch: rank " + std::to_string(source) + " sent " +
                       std::to_string(pairs) + " pairs in its messages, " +
                       std::to_string(header.pairs) + " in its header");
    }
  }
  return ok_status();
}

int ExpertExchange::received_tokens(int slot, int source) const {
  RegionHeader header;
  std::memcpy(&header, window_->local().data() + layout_.dispatch_region(slot, source),
              sizeof header);
  return static_cast<int>(header.tokens);
}

int64_t ExpertExchange::received_layer(int slot, int source) const {
  RegionHeader header;
  std::memcpy(&header, window_->local().data() + layout_.dispatch_region(slot, source),
              sizeof header);
  return header.layer;
}

int ExpertExchange::received_pairs(int slot, int source) const {
  RegionHeader header;
  std::memcpy(&header, window_->local().data() + layout_.dispatch_region(slot, source),
              sizeof header);
  return static_cast<int>(header.pairs);
}

ReceivedToken ExpertExchange::received(int slot, int source, int index) const {
  const std::byte* message = window_->local().data() + layout_.dispatch_region(slot, source) +
                             kAlign + index * layout_.message_bytes;
  MessageFields fields;
  std::memcpy(&fields, message, kFieldsBytes);
  ReceivedToken token;
  token.source = source;
  token.num_entries = fields.num_entries;
  token.local_slots = reinterpret_cast<const int32_t*>(message + kFieldsBytes);
  token.pair_slots = token.local_slots + shape_.top_k;
  token.header = message;
  token.payload = message + layout_.message_header_bytes;
  return token;
}

void ExpertExchange::load_activation(const ReceivedToken& token, float* row) const {
  const int64_t hidden = shape_.hidden_size;
  switch (shape_.dtype) {
    case DispatchDtype::kInt8: {
      MessageFields fields;
      std::memcpy(&fields, token.header, kFieldsBytes);
      kernels::dequantize_rows_int8(reinterpret_cast<const int8_t*>(token.payload), &fields.scale,
                                    1, hidden, row, hidden);
      break;
    }
    case DispatchDtype::kBf16:
      kernels::bf16_to_fp32(reinterpret_cast<const bf16*>(token.payload), row, hidden);
      break;
    case DispatchDtype::kFp32:
      std::memcpy(row, token.payload, hidden * sizeof(float));
      break;
  }
}

void ExpertExchange::stage_result(int slot, int source, int32_t pair_slot, const float* row) {
  PS_CHECK(source >= 0 && source < shape_.num_ranks && pair_slot >= 0 &&
           pair_slot < layout_.max_pairs_per_peer)
      << "source " << source << " pair " << pair_slot;
  std::byte* region = result_in_place(source)
                          ? direct_[source] + layout_.combine_region(slot, comm_.rank())
                          : result_staging_.data() + source * layout_.combine_region_bytes;
  std::byte* out = region + pair_slot * layout_.result_bytes;
  if (shape_.dtype == DispatchDtype::kFp32) {
    std::memcpy(out, row, shape_.hidden_size * sizeof(float));
  } else {
    kernels::fp32_to_bf16(row, reinterpret_cast<bf16*>(out), shape_.hidden_size);
  }
}

bool ExpertExchange::result_in_place(int source) const {
  // fp32 rows for a peer go straight there too: each is copied as it is, one large memcpy
  // (4 KiB at hidden 1,024), and staging them as well only adds a pass over 3 MiB at 128
  // tokens per rank (combine 191-213 -> 290-320 us when it did).
  return direct_[source] != nullptr &&
         (source == comm_.rank() || shape_.dtype == DispatchDtype::kFp32);
}

Status ExpertExchange::send_results(int slot) {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "slot " << slot;
  const int ranks = shape_.num_ranks, me = comm_.rank();
  for (int i = 0; i < ranks; ++i) {
    const int source = (me + i) % ranks;
    if (result_in_place(source)) continue;  // stored there by stage_result
    const size_t bytes = received_pairs(slot, source) * layout_.result_bytes;
    PS_RETURN_IF_ERROR(copy_to_peer(
        source, layout_.combine_region(slot, me),
        std::span(result_staging_.data() + source * layout_.combine_region_bytes, bytes)));
  }
  for (int i = 0; i < ranks; ++i) {
    const int source = (me + i) % ranks;
    PS_RETURN_IF_ERROR(window_->signal(source, layout_.combine_flag(slot, me), sequence_[slot]));
  }
  return ok_status();
}

Status ExpertExchange::combine(int slot, const RoutedTokens& tokens, std::span<float> out) {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "slot " << slot;
  const int64_t n = tokens.num_tokens, k = tokens.top_k, hidden = tokens.hidden_size;
  if (static_cast<int64_t>(out.size()) != n * hidden) {
    return invalid_argument("expert combine: output of " + std::to_string(out.size()) +
                            " floats for " + std::to_string(n) + " tokens x " +
                            std::to_string(hidden));
  }
  PS_RETURN_IF_ERROR(wait_all(slot, true, "its expert results"));
  const std::byte* base = window_->local().data();
  const int32_t* owner_of = pair_owner_[slot].data();
  const int32_t* position = pair_position_[slot].data();
  // Each token's k results, wherever they lie, summed in top-k order from zero and written
  // once: bit for bit the axpy calls of the single-process backend.
  auto sum_results = [&]<typename T>(std::vector<const T*>& rows) {
    PS_CHECK(static_cast<int64_t>(rows.size()) >= k) << "top " << k;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = t * k + j;
        rows[j] = reinterpret_cast<const T*>(base + layout_.combine_region(slot, owner_of[i]) +
                                             position[i] * layout_.result_bytes);
      }
      kernels::weighted_sum(tokens.weights.data() + t * k, rows.data(), k, out.data() + t * hidden,
                            hidden);
    }
  };
  if (shape_.dtype == DispatchDtype::kFp32) {
    sum_results(combine_rows_f32_);
  } else {
    sum_results(combine_rows_bf16_);
  }
  return ok_status();
}

}  // namespace peerserve::dist
