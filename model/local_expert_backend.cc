#include "model/local_expert_backend.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/scratch_vector.h"
#include "kernels/activation.h"
#include "kernels/matmul_int8.h"
#include "kernels/vector_ops.h"
#include "model/forward_step.h"

namespace peerserve {
namespace {

struct LocalCall final : ExpertBackend::Call {
  RoutedTokens tokens;
  std::span<const MlpWeights> experts;
  std::vector<int64_t> first_slot;         // [num_experts + 1]: expert e owns slots [first, next)
  std::vector<int64_t> next_slot;          // [num_experts]
  std::vector<int32_t> local_ids;          // [num_tokens * top_k]: index into experts
  std::vector<int64_t> slot_of_pair;       // [num_tokens * top_k]
  ScratchVector<float> x, gate, up, down;  // each written in full by its stage
  std::vector<LinearProblem> problems;
  std::vector<kernels::GateUpInt8Args> gate_up_int8;
  std::vector<kernels::MatmulInt8Args> down_int8;
  bool dispatched = false, computed = false;
};

LocalCall& as_local(ExpertBackend::Call& call) {
  auto* local = dynamic_cast<LocalCall*>(&call);
  PS_CHECK(local != nullptr);  // a call of another backend
  return *local;
}

}  // namespace

LocalExpertBackend::LocalExpertBackend(std::vector<std::span<const MlpWeights>> experts_by_layer,
                                       kernels::ActivationPrecision precision, ThreadPool* pool)
    : experts_by_layer_(std::move(experts_by_layer)), precision_(precision), pool_(pool) {
  for (std::span<const MlpWeights> experts : experts_by_layer_) {
    std::vector<int32_t>& index = index_of_logical_.emplace_back(experts.size());
    for (size_t e = 0; e < experts.size(); ++e) index[e] = static_cast<int32_t>(e);
  }
}

LocalExpertBackend::LocalExpertBackend(std::vector<HeldExperts> held_by_layer,
                                       kernels::ActivationPrecision precision, ThreadPool* pool)
    : precision_(precision), pool_(pool) {
  for (const HeldExperts& held : held_by_layer) {
    experts_by_layer_.push_back(held.weights);
    std::vector<int32_t>& index = index_of_logical_.emplace_back();
    if (held.logical_ids.empty()) {
      for (size_t e = 0; e < held.weights.size(); ++e) index.push_back(static_cast<int32_t>(e));
      continue;
    }
    PS_CHECK_EQ(held.logical_ids.size(), held.weights.size());
    for (size_t i = 0; i < held.logical_ids.size(); ++i) {
      const int32_t id = held.logical_ids[i];
      PS_CHECK(id >= 0);
      if (static_cast<size_t>(id) >= index.size()) index.resize(id + 1, -1);
      if (index[id] < 0) index[id] = static_cast<int32_t>(i);  // first copy serves
    }
  }
}

std::unique_ptr<ExpertBackend::Call> LocalExpertBackend::new_call(int /*slot*/) {
  return std::make_unique<LocalCall>();
}

Status LocalExpertBackend::dispatch(const RoutedTokens& tokens, Call& call_base) {
  LocalCall& call = as_local(call_base);
  call.dispatched = call.computed = false;
  if (tokens.layer < 0 || tokens.layer >= static_cast<int64_t>(experts_by_layer_.size()) ||
      experts_by_layer_[tokens.layer].empty()) {
    return invalid_argument("expert backend: layer " + std::to_string(tokens.layer) +
                            " has no routed experts");
  }
  std::span<const MlpWeights> experts = experts_by_layer_[tokens.layer];
  const std::vector<int32_t>& index_of = index_of_logical_[tokens.layer];
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  const int64_t t_count = tokens.num_tokens, top_k = tokens.top_k, hidden = tokens.hidden_size;
  const int64_t pairs = t_count * top_k;
  if (static_cast<int64_t>(tokens.activations.size()) != t_count * hidden ||
      static_cast<int64_t>(tokens.expert_ids.size()) != pairs ||
      static_cast<int64_t>(tokens.weights.size()) != pairs) {
    return invalid_argument("expert backend: inconsistent sizes for " + std::to_string(t_count) +
                            " tokens x top " + std::to_string(top_k));
  }
  call.local_ids.resize(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t id = tokens.expert_ids[i];
    if (id < 0 || static_cast<size_t>(id) >= index_of.size() || index_of[id] < 0) {
      return invalid_argument("expert backend: layer " + std::to_string(tokens.layer) +
                              ": expert " + std::to_string(id) + " is not held by this process (" +
                              std::to_string(num_experts) + " held)");
    }
    call.local_ids[i] = index_of[id];
  }
  call.tokens = tokens;
  call.experts = experts;
  if (LinearInputRecorder* r = linear_input_recorder()) {
    r->record_moe_input(tokens.layer, tokens.activations.data(), t_count, hidden);
  }

  // Slots: the pairs sorted by expert (stable), so each expert's tokens are contiguous.
  call.first_slot.assign(num_experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) ++call.first_slot[call.local_ids[i] + 1];
  for (int64_t e = 0; e < num_experts; ++e) call.first_slot[e + 1] += call.first_slot[e];
  call.next_slot.assign(call.first_slot.begin(), call.first_slot.end() - 1);
  call.slot_of_pair.resize(pairs);
  call.x.resize(pairs * hidden);
  for (int64_t i = 0; i < pairs; ++i) call.slot_of_pair[i] = call.next_slot[call.local_ids[i]]++;
  // The gather itself over row ranges (a prefill's copies kept one core busy, the other idle).
  for_row_ranges(ComputeContext{pool_, precision_}, pairs, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      std::memcpy(call.x.data() + call.slot_of_pair[i] * hidden,
                  tokens.activations.data() + (i / top_k) * hidden, hidden * sizeof(float));
    }
  });
  call.dispatched = true;
  return ok_status();
}

Status LocalExpertBackend::compute(Call& call_base) {
  LocalCall& call = as_local(call_base);
  PS_CHECK(call.dispatched);  // stages run in order: dispatch, compute, combine
  const int64_t hidden = call.tokens.hidden_size;
  const int64_t pairs = call.tokens.num_tokens * call.tokens.top_k;
  const int64_t num_experts = static_cast<int64_t>(call.experts.size());
  const int64_t inter = call.experts[0].gate.rows;
  call.gate.resize(pairs * inter);
  call.down.resize(pairs * hidden);
  bool int8 = true;  // W8A8 when every expert this call uses has its INT8 forms
  for (int64_t e = 0; e < num_experts && int8; ++e) {
    if (call.first_slot[e + 1] == call.first_slot[e]) continue;
    int8 = call.experts[e].gate_up_int8 && call.experts[e].down.int8;
  }
  if (int8) {
    // Fused gate/up/SiLU per expert, then down: grouped INT8 kernels (GEMV or GEMM inside
    // the kernel by the expert's row count).
    std::vector<kernels::GateUpInt8Args>& gate_up = call.gate_up_int8;
    std::vector<kernels::MatmulInt8Args>& down = call.down_int8;
    gate_up.clear();
    down.clear();
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t m = call.first_slot[e + 1] - call.first_slot[e];
      if (m == 0) continue;
      kernels::GateUpInt8Args g;
      g.x = call.x.data() + call.first_slot[e] * hidden;
      g.gate_up = call.experts[e].gate_up_int8.get();
      g.out = call.gate.data() + call.first_slot[e] * inter;
      g.m = m;
      gate_up.push_back(g);
      kernels::MatmulInt8Args d;
      d.x = g.out;
      d.w = call.experts[e].down.int8.get();
      d.y = call.down.data() + call.first_slot[e] * hidden;
      d.m = m;
      down.push_back(d);
    }
    kernels::grouped_gate_up_silu_int8(gate_up, pool_);
    kernels::grouped_matmul_int8(down, pool_);
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t m = call.first_slot[e + 1] - call.first_slot[e];
      add_int8_compensation(call.experts[e].down, m,
                            call.down.data() + call.first_slot[e] * hidden);
    }
    call.computed = true;
    return ok_status();
  }
  call.up.resize(pairs * inter);
  LinearInputRecorder* recorder = linear_input_recorder();
  std::vector<LinearProblem>& problems = call.problems;
  const ComputeContext ctx{pool_, precision_};
  problems.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = call.first_slot[e + 1] - call.first_slot[e];
    if (m == 0) continue;
    const float* x = call.x.data() + call.first_slot[e] * hidden;
    if (recorder != nullptr) {  // under gate's identity: up reads the same rows
      recorder->record(call.experts[e].gate.data, x, m, hidden, 0);
    }
    problems.push_back({.x = x,
                        .w = &call.experts[e].gate,
                        .y = call.gate.data() + call.first_slot[e] * inter,
                        .m = m});
    problems.push_back({.x = x,
                        .w = &call.experts[e].up,
                        .y = call.up.data() + call.first_slot[e] * inter,
                        .m = m});
  }
  grouped_bf16_linear(ctx, problems);
  for_row_ranges(ctx, pairs, [&](int64_t r0, int64_t r1, int) {
    kernels::silu_mul(call.gate.data() + r0 * inter, call.up.data() + r0 * inter,
                      call.gate.data() + r0 * inter, (r1 - r0) * inter);
  });
  problems.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = call.first_slot[e + 1] - call.first_slot[e];
    if (m == 0) continue;
    const float* x = call.gate.data() + call.first_slot[e] * inter;
    if (recorder != nullptr) recorder->record(call.experts[e].down.data, x, m, inter, 0);
    problems.push_back({.x = x,
                        .w = &call.experts[e].down,
                        .y = call.down.data() + call.first_slot[e] * hidden,
                        .m = m});
  }
  grouped_bf16_linear(ctx, problems);
  call.computed = true;
  return ok_status();
}

Status LocalExpertBackend::combine(Call& call_base, std::span<float> out) {
  LocalCall& call = as_local(call_base);
  PS_CHECK(call.computed);
  const int64_t hidden = call.tokens.hidden_size, top_k = call.tokens.top_k;
  if (static_cast<int64_t>(out.size()) != call.tokens.num_tokens * hidden) {
    return invalid_argument("expert backend: output has " + std::to_string(out.size()) +
                            " values, expected " + std::to_string(call.tokens.num_tokens) + " x " +
                            std::to_string(hidden));
  }
  // Combine in top-k order per token, from zero (kernels::weighted_sum).
  const ComputeContext ctx{pool_, precision_};
  for_row_ranges(ctx, call.tokens.num_tokens, [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<const float*> rows;  // grown once: no allocation per step
    rows.resize(static_cast<size_t>(top_k));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        rows[j] = call.down.data() + call.slot_of_pair[t * top_k + j] * hidden;
      }
      kernels::weighted_sum(call.tokens.weights.data() + t * top_k, rows.data(), top_k,
                            out.data() + t * hidden, hidden);
    }
  });
  call.dispatched = call.computed = false;
  return ok_status();
}

}  // namespace peerserve
