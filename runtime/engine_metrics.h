// EngineMetrics: what /metrics reports about the engine: request latencies (TTFT, inter-
// token latency, time per output token, end-to-end), token and request counters, and the
// scheduler's state (running/waiting, KV blocks, prefix-cache hits, preemptions).
//
// Thread-safety: the engine thread records; any thread may take a snapshot().
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "runtime/histogram.h"
#include "runtime/kv_pool_connector.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace peerserve {

struct EngineMetricsSnapshot {
  SchedulerStats scheduler;
  Histogram time_to_first_token{latency_buckets_seconds()};
  Histogram inter_token_latency{inter_token_buckets_seconds()};
  Histogram time_per_output_token{inter_token_buckets_seconds()};
  Histogram e2e_request_latency{latency_buckets_seconds()};
  Histogram queue_time{latency_buckets_seconds()};
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  // Indexed by FinishReason.
  std::array<int64_t, 4> requests_finished_total{};
  int64_t steps_total = 0;
  int64_t batched_tokens_total = 0;
  // The caching pool (when the engine uses one): the connector's counters, prompt tokens
  // whose KV came from the pool, and the time requests waited for their pool lookups.
  bool kv_pool_enabled = false;
  KvPoolCounters kv_pool;
  int64_t kv_pool_hit_tokens = 0;
  Histogram kv_pool_load_latency{latency_buckets_seconds()};
  // Speculative decoding (vLLM's names): verification events (a sequence's drafts checked
  // in one step), draft tokens checked, drafts accepted, accepted drafts by position in the
  // run (index 0 = the first draft), and tokens emitted per verification (1 + accepted).
  int32_t spec_decode_num_speculative_tokens = 0;  // K; 0 = speculative decoding off
  bool spec_decode_active = false;                 // false once the guard turned it off
  int64_t spec_decode_num_drafts = 0;
  int64_t spec_decode_num_draft_tokens = 0;
  int64_t spec_decode_num_accepted_tokens = 0;
  std::array<int64_t, kMaxSpeculativeTokens> spec_decode_accepted_per_position{};
  Histogram spec_decode_acceptance_length{acceptance_length_buckets()};
};

class EngineMetrics {
 public:
  EngineMetricsSnapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return data_;
  }
  // Runs `fn(EngineMetricsSnapshot&)` under the lock.
  template <typename Fn>
  void update(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    fn(data_);
  }

 private:
  mutable std::mutex mutex_;
  EngineMetricsSnapshot data_;
};

}  // namespace peerserve
