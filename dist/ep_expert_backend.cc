#include "dist/ep_expert_backend.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/activation.h"

namespace peerserve::dist {
namespace {

struct EpCall final : ExpertBackend::Call {
  enum class Stage : uint8_t { kIdle, kDispatched, kComputed };
  int slot = 0;
  Stage stage = Stage::kIdle;
  RoutedTokens tokens;
};

EpCall& as_ep_call(ExpertBackend::Call& call) {
  EpCall* ep = dynamic_cast<EpCall*>(&call);
  PS_CHECK(ep != nullptr) << "a Call from another ExpertBackend";
  return *ep;
}

Status out_of_order(const char* method, const EpCall& call) {
  return internal_error(std::string("expert backend: ") + method + " on microbatch " +
                        std::to_string(call.slot) + " out of order (dispatch, compute, combine)");
}

}  // namespace

Result<std::unique_ptr<EpExpertBackend>> EpExpertBackend::create(EpExpertBackendOptions options) {
  if (options.communicator == nullptr) return invalid_argument("expert backend: no communicator");
  Communicator& comm = *options.communicator;
  const ExpertPlacement& placement = options.placement;
  if (placement.num_ranks() != comm.size()) {
    return invalid_argument("--ep " + std::to_string(placement.num_ranks()) +
                            " differs from the number of ranks " + std::to_string(comm.size()) +
                            " (start as many processes as --ep)");
  }
  int64_t max_intermediate = 0;
  for (int layer : placement.moe_layers()) {
    if (layer >= static_cast<int>(options.local_experts_by_layer.size()) ||
        static_cast<int>(options.local_experts_by_layer[layer].size()) !=
            placement.slots_per_rank()) {
      return invalid_argument(
          "expert backend: layer " + std::to_string(layer) + " needs the weights of " +
          std::to_string(placement.slots_per_rank()) + " local experts, got " +
          std::to_string(layer < static_cast<int>(options.local_experts_by_layer.size())
                             ? options.local_experts_by_layer[layer].size()
                             : 0));
    }
    for (const MlpWeights& expert : options.local_experts_by_layer[layer]) {
      if (expert.gate.cols != options.hidden_size || expert.up.cols != options.hidden_size ||
          expert.down.rows != options.hidden_size || expert.up.rows != expert.gate.rows ||
          expert.down.cols != expert.gate.rows) {
        return invalid_argument("expert backend: layer " + std::to_string(layer) +
                                " has an expert whose shapes do not match hidden size " +
                                std::to_string(options.hidden_size));
      }
      max_intermediate = std::max(max_intermediate, expert.gate.rows);
    }
  }
  ExchangeShape shape;
  shape.num_ranks = comm.size();
  shape.max_tokens_per_rank = options.max_tokens_per_rank;
  shape.hidden_size = options.hidden_size;
  shape.top_k = options.top_k;
  shape.slots_per_rank = placement.slots_per_rank();
  shape.dtype = options.dispatch_dtype;
  shape.direct_stores = options.direct_stores;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ExpertExchange> exchange,
                      ExpertExchange::create(comm, shape, options.peer_timeout));
  return std::make_unique<EpExpertBackend>(std::move(options), std::move(exchange),
                                           max_intermediate);
}

EpExpertBackend::EpExpertBackend(EpExpertBackendOptions options,
                                 std::unique_ptr<ExpertExchange> exchange, int64_t max_intermediate)
    : options_(std::move(options)), exchange_(std::move(exchange)) {
  const int64_t rows = exchange_->shape().num_ranks * exchange_->layout().max_pairs_per_peer;
  x_.resize(rows * options_.hidden_size);
  gate_.resize(rows * max_intermediate);
  up_.resize(rows * max_intermediate);
  down_.resize(rows * options_.hidden_size);
  row_source_.resize(rows);
  row_pair_.resize(rows);
  first_row_.resize(options_.placement.slots_per_rank() + 1);
  next_row_.resize(options_.placement.slots_per_rank());
  problems_.reserve(2 * options_.placement.slots_per_rank());
  gate_up_int8_.reserve(options_.placement.slots_per_rank());
  down_int8_.reserve(options_.placement.slots_per_rank());
}

std::unique_ptr<ExpertBackend::Call> EpExpertBackend::new_call(int slot) {
  PS_CHECK(slot >= 0 && slot < ExchangeLayout::kSlots) << "microbatch slot " << slot;
  auto call = std::make_unique<EpCall>();
  call->slot = slot;
  return call;
}

Status EpExpertBackend::dispatch(const RoutedTokens& tokens, Call& call) {
  EpCall& ep = as_ep_call(call);
  if (ep.stage != EpCall::Stage::kIdle) return out_of_order("dispatch", ep);
  PS_RETURN_IF_ERROR(exchange_->dispatch(ep.slot, tokens, options_.placement));
  ep.tokens = tokens;
  ep.stage = EpCall::Stage::kDispatched;
  return ok_status();
}

Status EpExpertBackend::compute(Call& call) {
  EpCall& ep = as_ep_call(call);
  if (ep.stage != EpCall::Stage::kDispatched) return out_of_order("compute", ep);
  ep.stage = EpCall::Stage::kComputed;
  const int slot = ep.slot, ranks = exchange_->shape().num_ranks;
  const int64_t hidden = options_.hidden_size, layer = ep.tokens.layer;
  PS_RETURN_IF_ERROR(exchange_->wait_dispatch(slot));
  std::span<const MlpWeights> experts = options_.local_experts_by_layer[layer];
  const int64_t num_local = static_cast<int64_t>(experts.size());

  // Rows grouped by local expert: count, prefix sums, then gather.
  std::fill(first_row_.begin(), first_row_.end(), 0);
  for (int source = 0; source < ranks; ++source) {
    if (exchange_->received_layer(slot, source) != layer) {
      return data_loss("expert compute: rank " + std::to_string(source) + " is at layer " +
                       std::to_string(exchange_->received_layer(slot, source)) + ", rank " +
                       std::to_string(exchange_->communicator().rank()) + " at layer " +
                       std::to_string(layer) + " (ranks out of lock-step)");
    }
    const int count = exchange_->received_tokens(slot, source);
    for (int m = 0; m < count; ++m) {
      const ReceivedToken token = exchange_->received(slot, source, m);
      for (int e = 0; e < token.num_entries; ++e) {
        const int32_t local = token.local_slots[e];
        if (local < 0 || local >= num_local) {
          return data_loss("expert compute: rank " + std::to_string(source) +
                           " sent a token for local expert " + std::to_string(local) + " of " +
                           std::to_string(num_local));
        }
        ++first_row_[local + 1];
      }
    }
  }
  for (int64_t e = 0; e < num_local; ++e) first_row_[e + 1] += first_row_[e];
  std::copy(first_row_.begin(), first_row_.end() - 1, next_row_.begin());
  for (int source = 0; source < ranks; ++source) {
    const int count = exchange_->received_tokens(slot, source);
    for (int m = 0; m < count; ++m) {
      const ReceivedToken token = exchange_->received(slot, source, m);
      int64_t loaded = -1;  // a token sent for several local experts is converted once
      for (int e = 0; e < token.num_entries; ++e) {
        const int64_t row = next_row_[token.local_slots[e]]++;
        if (loaded < 0) {
          exchange_->load_activation(token, x_.data() + row * hidden);
          loaded = row;
        } else {
          std::memcpy(x_.data() + row * hidden, x_.data() + loaded * hidden,
                      hidden * sizeof(float));
        }
        row_source_[row] = source;
        row_pair_[row] = token.pair_slots[e];
      }
    }
  }
  const int64_t rows = first_row_[num_local];

  // The experts: as LocalExpertBackend (W8A8 when every expert used has its INT8 forms,
  // else gate and up in one grouped BF16 GEMM, then down).
  const int64_t inter = num_local > 0 ? experts[0].gate.rows : 0;
  bool int8 = true;
  for (int64_t e = 0; e < num_local && int8; ++e) {
    if (first_row_[e + 1] == first_row_[e]) continue;
    int8 = experts[e].gate_up_int8 && experts[e].down.int8;
  }
  if (int8) {
    gate_up_int8_.clear();
    down_int8_.clear();
    for (int64_t e = 0; e < num_local; ++e) {
      const int64_t m = first_row_[e + 1] - first_row_[e];
      if (m == 0) continue;
      kernels::GateUpInt8Args g;
      g.x = x_.data() + first_row_[e] * hidden;
      g.gate_up = experts[e].gate_up_int8.get();
      g.out = gate_.data() + first_row_[e] * inter;
      g.m = m;
      gate_up_int8_.push_back(g);
      kernels::MatmulInt8Args d;
      d.x = g.out;
      d.w = experts[e].down.int8.get();
      d.y = down_.data() + first_row_[e] * hidden;
      d.m = m;
      down_int8_.push_back(d);
    }
    kernels::grouped_gate_up_silu_int8(gate_up_int8_, options_.pool);
    kernels::grouped_matmul_int8(down_int8_, options_.pool);
    for (int64_t e = 0; e < num_local; ++e) {
      const int64_t m = first_row_[e + 1] - first_row_[e];
      add_int8_compensation(experts[e].down, m, down_.data() + first_row_[e] * hidden);
    }
  } else {
    PS_RETURN_IF_ERROR(compute_bf16(experts, rows, inter));
  }
  for (int64_t row = 0; row < rows; ++row) {
    exchange_->stage_result(slot, row_source_[row], row_pair_[row], down_.data() + row * hidden);
  }
  return exchange_->send_results(slot);
}

Status EpExpertBackend::compute_bf16(std::span<const MlpWeights> experts, int64_t rows,
                                     int64_t inter) {
  const int64_t hidden = options_.hidden_size;
  const int64_t num_local = static_cast<int64_t>(experts.size());
  for (int64_t e = 0; e < num_local; ++e) {
    if (first_row_[e + 1] > first_row_[e] &&
        (experts[e].gate.data == nullptr || experts[e].up.data == nullptr ||
         experts[e].down.data == nullptr)) {
      return internal_error("expert compute: local expert " + std::to_string(e) +
                            " has neither BF16 nor complete INT8 weights");
    }
  }
  const ComputeContext ctx{options_.pool, options_.precision};
  problems_.clear();
  for (int64_t e = 0; e < num_local; ++e) {
    const int64_t m = first_row_[e + 1] - first_row_[e];
    if (m == 0) continue;
    const float* x = x_.data() + first_row_[e] * hidden;
    problems_.push_back(
        {.x = x, .w = &experts[e].gate, .y = gate_.data() + first_row_[e] * inter, .m = m});
    problems_.push_back(
        {.x = x, .w = &experts[e].up, .y = up_.data() + first_row_[e] * inter, .m = m});
  }
  grouped_bf16_linear(ctx, problems_);
  kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), rows * inter);
  problems_.clear();
  for (int64_t e = 0; e < num_local; ++e) {
    const int64_t m = first_row_[e + 1] - first_row_[e];
    if (m == 0) continue;
    problems_.push_back({.x = gate_.data() + first_row_[e] * inter,
                         .w = &experts[e].down,
                         .y = down_.data() + first_row_[e] * hidden,
                         .m = m});
  }
  grouped_bf16_linear(ctx, problems_);
  return ok_status();
}

bool EpExpertBackend::ready(const Call& call) const {
  const EpCall* ep = dynamic_cast<const EpCall*>(&call);
  if (ep == nullptr) return true;  // not ours: the stage reports the misuse
  switch (ep->stage) {
    case EpCall::Stage::kDispatched:
      return exchange_->arrived(ep->slot, /*results=*/false);
    case EpCall::Stage::kComputed:
      return exchange_->arrived(ep->slot, /*results=*/true);
    case EpCall::Stage::kIdle:
      return true;
  }
  return true;
}

Status EpExpertBackend::combine(Call& call, std::span<float> out) {
  EpCall& ep = as_ep_call(call);
  if (ep.stage != EpCall::Stage::kComputed) return out_of_order("combine", ep);
  ep.stage = EpCall::Stage::kIdle;
  return exchange_->combine(ep.slot, ep.tokens, out);
}

}  // namespace peerserve::dist
