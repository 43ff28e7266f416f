// BenchClient: a load generator for OpenAI-compatible servers, shaped like vLLM's
// benchmark_serving: synthetic token-id prompts of a fixed input length with a chosen
// fraction shared by all prompts (to exercise prefix caching), Poisson arrivals at a given
// rate and/or a concurrency cap, streamed completions of a fixed output length
// (ignore_eos), and a report of throughput, TTFT / TPOT / ITL / end-to-end latency
// percentiles and goodput under SLOs.
//
// All requests run on one thread over asynchronous sockets (Boost.Asio/Beast), so hundreds
// of concurrent streams do not need hundreds of threads. Talks plain HTTP only.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host:port, plain http
  std::string endpoint = "/v1/completions";   // or /v1/chat/completions
  std::string model;                          // empty: the first model of GET /v1/models
  std::string api_key;                        // sent as a Bearer token when set
  int32_t num_prompts = 100;
  // Poisson arrival rate in requests/s; infinity = all at once.
  double request_rate = std::numeric_limits<double>::infinity();
  int32_t max_concurrency = 0;  // requests in flight at most; 0 = no cap
  int32_t input_len = 128;
  int32_t output_len = 128;
  double prefix_share = 0.0;  // fraction of input_len shared by every prompt, in [0, 1]
  uint64_t seed = 0;
  // Ask for stream_options.continuous_usage_stats (running usage in every chunk) to time
  // each token (TBT). Off for servers that refuse the field.
  bool continuous_usage = true;
  // Prompt token ids are drawn uniformly from [token_low, token_high).
  int32_t token_low = 10;
  int32_t token_high = 250;
  // SLOs for goodput in milliseconds (unset = not constrained).
  std::optional<double> slo_ttft_ms;
  std::optional<double> slo_tpot_ms;
  std::optional<double> slo_e2el_ms;
  double request_timeout_seconds = 600;

  Status validate() const;
};

struct LatencySummary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // milliseconds
  int64_t count = 0;
};

struct BenchReport {
  double duration_s = 0;
  int32_t completed = 0;
  int32_t failed = 0;
  std::vector<std::string> first_errors;  // up to 5
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  int64_t cached_prompt_tokens = 0;   // as the server reported (usage.prompt_tokens_details)
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output) tokens / s
  double goodput = 0;                 // requests meeting every SLO / s
  int32_t good_requests = 0;
  // itl: gaps between chunks that carry a choice, whether or not its text is empty (as vLLM's
  // benchmark counts them). tbt: per token, each chunk's gap spread over the tokens it
  // carries (from the server's running usage; differs from itl when a chunk carries several).
  LatencySummary ttft, tpot, itl, tbt, e2el;
  int32_t max_in_flight = 0;

  nlohmann::json to_json(const BenchOptions& options) const;
  std::string to_text(const BenchOptions& options) const;
};

// Linear-interpolated percentile (numpy's default), q in [0, 100]. 0 for an empty vector.
double percentile(std::vector<double> values, double q);

// The synthetic prompts `run_bench` sends (exposed for tests).
std::vector<std::vector<int32_t>> make_bench_prompts(const BenchOptions& options);
// Arrival offsets in seconds from the start (0 for all when the rate is infinite).
std::vector<double> make_arrival_times(const BenchOptions& options);

// Called after each finished request: (finished, total).
using BenchProgress = std::function<void(int32_t done, int32_t total)>;

Result<BenchReport> run_bench(const BenchOptions& options, const BenchProgress& progress = {});

}  // namespace peerserve
