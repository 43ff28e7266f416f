#include "runtime/engine_metrics_codec.h"

#include <algorithm>
#include <array>
#include <type_traits>

namespace peerserve {
namespace {

// Calls f(a_field, b_field) for every summed field of two snapshots, in one fixed order:
// the order of the encoding, so encode, decode and add cannot disagree on a field.
template <typename A, typename B, typename F>
void zip_summed_fields(A& a, B& b, F&& f) {
  f(a.scheduler.num_running, b.scheduler.num_running);
  f(a.scheduler.num_waiting, b.scheduler.num_waiting);
  f(a.scheduler.num_blocks, b.scheduler.num_blocks);
  f(a.scheduler.num_used_blocks, b.scheduler.num_used_blocks);
  f(a.scheduler.num_free_blocks, b.scheduler.num_free_blocks);
  f(a.scheduler.num_cached_blocks, b.scheduler.num_cached_blocks);
  f(a.scheduler.num_preemptions, b.scheduler.num_preemptions);
  f(a.scheduler.pool.prefix_query_tokens, b.scheduler.pool.prefix_query_tokens);
  f(a.scheduler.pool.prefix_hit_tokens, b.scheduler.pool.prefix_hit_tokens);
  f(a.scheduler.pool.evictions, b.scheduler.pool.evictions);
  f(a.time_to_first_token, b.time_to_first_token);
  f(a.inter_token_latency, b.inter_token_latency);
  f(a.time_per_output_token, b.time_per_output_token);
  f(a.e2e_request_latency, b.e2e_request_latency);
  f(a.queue_time, b.queue_time);
  f(a.prompt_tokens_total, b.prompt_tokens_total);
  f(a.generation_tokens_total, b.generation_tokens_total);
  f(a.requests_finished_total, b.requests_finished_total);
  f(a.steps_total, b.steps_total);
  f(a.batched_tokens_total, b.batched_tokens_total);
  f(a.kv_pool.loads, b.kv_pool.loads);
  f(a.kv_pool.loads_cancelled, b.kv_pool.loads_cancelled);
  f(a.kv_pool.blocks_looked_up, b.kv_pool.blocks_looked_up);
  f(a.kv_pool.blocks_hit, b.kv_pool.blocks_hit);
  f(a.kv_pool.bytes_loaded, b.kv_pool.bytes_loaded);
  f(a.kv_pool.blocks_stored, b.kv_pool.blocks_stored);
  f(a.kv_pool.bytes_stored, b.kv_pool.bytes_stored);
  f(a.kv_pool.store_failures, b.kv_pool.store_failures);
  f(a.kv_pool.load_seconds_total, b.kv_pool.load_seconds_total);
  f(a.kv_pool.remote_prefills, b.kv_pool.remote_prefills);
  f(a.kv_pool.remote_prefill_failures, b.kv_pool.remote_prefill_failures);
  f(a.kv_pool.remote_prefill_seconds_total, b.kv_pool.remote_prefill_seconds_total);
  f(a.kv_pool.pushes, b.kv_pool.pushes);
  f(a.kv_pool.push_blocks, b.kv_pool.push_blocks);
  f(a.kv_pool.push_bytes, b.kv_pool.push_bytes);
  f(a.kv_pool.push_failures, b.kv_pool.push_failures);
  f(a.kv_pool.push_seconds_total, b.kv_pool.push_seconds_total);
  f(a.kv_pool.handoff_blocks, b.kv_pool.handoff_blocks);
  f(a.kv_pool.handoff_bytes, b.kv_pool.handoff_bytes);
  f(a.kv_pool.handoff_seconds_total, b.kv_pool.handoff_seconds_total);
  f(a.kv_pool_hit_tokens, b.kv_pool_hit_tokens);
  f(a.kv_pool_load_latency, b.kv_pool_load_latency);
  f(a.spec_decode_num_drafts, b.spec_decode_num_drafts);
  f(a.spec_decode_num_draft_tokens, b.spec_decode_num_draft_tokens);
  f(a.spec_decode_num_accepted_tokens, b.spec_decode_num_accepted_tokens);
  f(a.spec_decode_accepted_per_position, b.spec_decode_accepted_per_position);
  f(a.spec_decode_acceptance_length, b.spec_decode_acceptance_length);
}

template <typename T>
struct IsStdArray : std::false_type {};
template <typename T, size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {};

}  // namespace

void encode_engine_metrics(const EngineMetricsSnapshot& metrics, ByteWriter& out) {
  out.put_bool(metrics.kv_pool_enabled);
  out.put<int32_t>(metrics.spec_decode_num_speculative_tokens);
  out.put_bool(metrics.spec_decode_active);
  zip_summed_fields(metrics, metrics, [&](const auto& field, const auto&) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, Histogram>) {
      out.put_array(std::span<const uint64_t>(field.bucket_counts()));
      out.put<double>(field.sum());
    } else if constexpr (IsStdArray<T>::value) {
      out.put_array(std::span<const typename T::value_type>(field));
    } else {
      out.put<T>(field);
    }
  });
}

Result<EngineMetricsSnapshot> decode_engine_metrics(ByteReader& in) {
  EngineMetricsSnapshot m;
  m.kv_pool_enabled = in.get_bool();
  m.spec_decode_num_speculative_tokens = in.get<int32_t>();
  m.spec_decode_active = in.get_bool();
  bool shapes_match = true;
  zip_summed_fields(m, m, [&](auto& field, auto&) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, Histogram>) {
      const std::vector<uint64_t> counts = in.get_array<uint64_t>();
      const double sum = in.get<double>();
      if (in.ok()) shapes_match = field.assign(counts, sum) && shapes_match;
    } else if constexpr (IsStdArray<T>::value) {
      const auto values = in.get_array<typename T::value_type>();
      if (in.ok() && values.size() == field.size()) {
        std::copy(values.begin(), values.end(), field.begin());
      } else {
        shapes_match = false;
      }
    } else {
      field = in.get<T>();
    }
  });
  if (!in.ok() || !shapes_match) return data_loss("engine metrics: truncated or misshaped");
  return m;
}

void add_engine_metrics(EngineMetricsSnapshot& into, const EngineMetricsSnapshot& from) {
  into.kv_pool_enabled = into.kv_pool_enabled || from.kv_pool_enabled;
  into.spec_decode_num_speculative_tokens =
      std::max(into.spec_decode_num_speculative_tokens, from.spec_decode_num_speculative_tokens);
  into.spec_decode_active = into.spec_decode_active || from.spec_decode_active;
  zip_summed_fields(into, from, [](auto& total, const auto& part) {
    using T = std::decay_t<decltype(total)>;
    if constexpr (std::is_same_v<T, Histogram>) {
      total.add(part);  // the same bounds: both built by this binary
    } else if constexpr (IsStdArray<T>::value) {
      for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
    } else {
      total += part;
    }
  });
}

}  // namespace peerserve
