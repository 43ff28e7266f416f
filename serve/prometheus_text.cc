#include "serve/prometheus_text.h"

#include <charconv>
#include <cmath>

namespace peerserve {

std::string prometheus_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : std::string("NaN");
}

std::string prometheus_escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusText::family(std::string_view name, std::string_view help, std::string_view type) {
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  text_ += help;
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += type;
  text_ += '\n';
}

void PrometheusText::sample(std::string_view name, const MetricLabels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) text_ += ',';
      text_ += labels[i].first + "=\"" + prometheus_escape(labels[i].second) + '"';
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += prometheus_number(value);
  text_ += '\n';
}

void PrometheusText::counter(std::string_view name, std::string_view help,
                             const MetricLabels& labels, double value) {
  family(name, help, "counter");
  sample(name, labels, value);
}

void PrometheusText::gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
                           double value) {
  family(name, help, "gauge");
  sample(name, labels, value);
}

void PrometheusText::histogram(std::string_view name, std::string_view help,
                               const MetricLabels& labels, const Histogram& histogram) {
  family(name, help, "histogram");
  const std::string base(name);
  const std::vector<uint64_t> cumulative = histogram.cumulative_counts();
  for (size_t i = 0; i < cumulative.size(); ++i) {
    MetricLabels with_le = labels;
    with_le.emplace_back("le", prometheus_number(histogram.upper_bounds()[i]));
    sample(base + "_bucket", with_le, static_cast<double>(cumulative[i]));
  }
  MetricLabels inf = labels;
  inf.emplace_back("le", "+Inf");
  sample(base + "_bucket", inf, static_cast<double>(histogram.count()));
  sample(base + "_sum", labels, histogram.sum());
  sample(base + "_count", labels, static_cast<double>(histogram.count()));
}

namespace {

// The families vLLM exposes under these names (its dashboards, autoscaling rules and routers
// read them): each is written a second time under the vLLM name.
constexpr std::pair<std::string_view, std::string_view> kVllmNames[] = {
    {"peerserve:num_requests_running", "vllm:num_requests_running"},
    {"peerserve:num_requests_waiting", "vllm:num_requests_waiting"},
    {"peerserve:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"},
    {"peerserve:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},  // vLLM's older name
    {"peerserve:prefix_cache_queries_total", "vllm:prefix_cache_queries_total"},
    {"peerserve:prefix_cache_hits_total", "vllm:prefix_cache_hits_total"},
    {"peerserve:num_preemptions_total", "vllm:num_preemptions_total"},
    {"peerserve:prompt_tokens_total", "vllm:prompt_tokens_total"},
    {"peerserve:generation_tokens_total", "vllm:generation_tokens_total"},
    {"peerserve:request_success_total", "vllm:request_success_total"},
    {"peerserve:time_to_first_token_seconds", "vllm:time_to_first_token_seconds"},
    {"peerserve:inter_token_latency_seconds", "vllm:inter_token_latency_seconds"},
    {"peerserve:time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds"},
    {"peerserve:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"},
    {"peerserve:request_queue_time_seconds", "vllm:request_queue_time_seconds"},
    {"peerserve:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total"},
    {"peerserve:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"},
    {"peerserve:spec_decode_num_accepted_tokens_total",
     "vllm:spec_decode_num_accepted_tokens_total"},
    {"peerserve:spec_decode_num_accepted_tokens_per_pos_total",
     "vllm:spec_decode_num_accepted_tokens_per_pos_total"},
};

// The family a line of the exposition belongs to: the name after "# HELP "/"# TYPE ", or
// the sample's name without a histogram's _bucket/_sum/_count.
std::string_view family_of(std::string_view line) {
  if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
    line.remove_prefix(7);
    return line.substr(0, line.find(' '));
  }
  std::string_view name = line.substr(0, line.find_first_of("{ "));
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name.ends_with(suffix)) {
      const std::string_view base = name.substr(0, name.size() - suffix.size());
      for (const auto& [ours, theirs] : kVllmNames) {
        if (ours == base) return base;
      }
    }
  }
  return name;
}

// `text` followed by the families of kVllmNames again under vLLM's names (each family's
// lines stay together, as the format requires).
std::string with_vllm_names(std::string text) {
  std::string aliases;
  for (const auto& [ours, theirs] : kVllmNames) {
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string_view line(text.data() + start, end - start);
      if (family_of(line) == ours) {
        const size_t at = line.find(ours);
        aliases.append(line.substr(0, at));
        aliases.append(theirs);
        aliases.append(line.substr(at + ours.size()));
        aliases.push_back('\n');
      }
      start = end + 1;
    }
  }
  return text + aliases;
}

}  // namespace

std::string render_forced_tool_call_fallbacks(int64_t any_object, int64_t unconstrained,
                                              const std::string& model_name) {
  PrometheusText out;
  const std::string_view name = "peerserve:forced_tool_call_fallbacks_total";
  out.family(name,
             "Forced tool calls whose schemas were over the automaton's bounds: decoded with "
             "any JSON object as arguments, or unconstrained.",
             "counter");
  out.sample(name, {{"model_name", model_name}, {"constraint", "any_object"}},
             static_cast<double>(any_object));
  out.sample(name, {{"model_name", model_name}, {"constraint", "none"}},
             static_cast<double>(unconstrained));
  return out.text();
}

std::string render_server_metrics(const EngineMetricsSnapshot& m, const HttpServerCounters& http,
                                  const std::string& model_name) {
  PrometheusText out;
  const MetricLabels labels = {{"model_name", model_name}};
  const SchedulerStats& s = m.scheduler;
  out.gauge("peerserve:num_requests_running", "Sequences in the running batch.", labels,
            s.num_running);
  out.gauge("peerserve:num_requests_waiting", "Sequences waiting to be scheduled.", labels,
            s.num_waiting);
  out.gauge("peerserve:kv_cache_blocks_total", "KV cache blocks in the pool.", labels,
            s.num_blocks);
  out.gauge("peerserve:kv_cache_blocks_used", "KV cache blocks referenced by sequences.", labels,
            s.num_used_blocks);
  out.gauge("peerserve:kv_cache_blocks_free",
            "KV cache blocks not referenced (including evictable cached blocks).", labels,
            s.num_free_blocks);
  out.gauge("peerserve:kv_cache_blocks_cached", "KV cache blocks in the prefix-cache index.",
            labels, s.num_cached_blocks);
  out.gauge("peerserve:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", labels,
            s.num_blocks > 0 ? static_cast<double>(s.num_used_blocks) / s.num_blocks : 0.0);
  out.counter("peerserve:prefix_cache_queries_total",
              "Prompt tokens looked up in the prefix cache.", labels,
              static_cast<double>(s.pool.prefix_query_tokens));
  out.counter("peerserve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
              labels, static_cast<double>(s.pool.prefix_hit_tokens));
  out.gauge("peerserve:prefix_cache_hit_rate",
            "prefix_cache_hits_total / prefix_cache_queries_total since start.", labels,
            s.pool.prefix_query_tokens > 0
                ? static_cast<double>(s.pool.prefix_hit_tokens) / s.pool.prefix_query_tokens
                : 0.0);
  out.counter("peerserve:prefix_cache_evictions_total", "Cached KV blocks reused for other tokens.",
              labels, static_cast<double>(s.pool.evictions));
  out.counter("peerserve:num_preemptions_total",
              "Sequences preempted (KV freed, recomputed later) for lack of KV blocks.", labels,
              static_cast<double>(s.num_preemptions));
  out.counter("peerserve:prompt_tokens_total", "Prompt tokens of requests that started generating.",
              labels, static_cast<double>(m.prompt_tokens_total));
  out.counter("peerserve:generation_tokens_total", "Generated tokens.", labels,
              static_cast<double>(m.generation_tokens_total));
  out.counter("peerserve:engine_steps_total", "Engine steps (forward passes).", labels,
              static_cast<double>(m.steps_total));
  out.counter("peerserve:batched_tokens_total", "Tokens computed over all engine steps.", labels,
              static_cast<double>(m.batched_tokens_total));
  out.family("peerserve:request_success_total", "Finished requests by finish reason.", "counter");
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    MetricLabels l = labels;
    l.emplace_back("finished_reason", std::string(finish_reason_name(r)));
    out.sample("peerserve:request_success_total", l,
               static_cast<double>(m.requests_finished_total[static_cast<size_t>(r)]));
  }
  out.histogram("peerserve:time_to_first_token_seconds",
                "Time from request arrival to its first generated token.", labels,
                m.time_to_first_token);
  out.histogram("peerserve:inter_token_latency_seconds",
                "Time between consecutive tokens of a sequence.", labels, m.inter_token_latency);
  out.histogram("peerserve:time_per_output_token_seconds",
                "Per request: (last token time - first token time) / (tokens - 1).", labels,
                m.time_per_output_token);
  out.histogram("peerserve:e2e_request_latency_seconds",
                "Time from request arrival to its last output.", labels, m.e2e_request_latency);
  out.histogram("peerserve:request_queue_time_seconds",
                "Time from request arrival to its first scheduled step.", labels, m.queue_time);
  if (m.spec_decode_num_speculative_tokens > 0) {
    out.gauge("peerserve:spec_decode_enabled",
              "1 while speculative decoding runs (0 once turned off for low acceptance).", labels,
              m.spec_decode_active ? 1.0 : 0.0);
    out.counter("peerserve:spec_decode_num_drafts_total",
                "Speculative verifications (a sequence's drafts checked in one step).", labels,
                static_cast<double>(m.spec_decode_num_drafts));
    out.counter("peerserve:spec_decode_num_draft_tokens_total", "Draft tokens verified.", labels,
                static_cast<double>(m.spec_decode_num_draft_tokens));
    out.counter("peerserve:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", labels,
                static_cast<double>(m.spec_decode_num_accepted_tokens));
    out.family("peerserve:spec_decode_num_accepted_tokens_per_pos_total",
               "Draft tokens accepted, by position in the draft run (0 = first).", "counter");
    for (int32_t k = 0; k < m.spec_decode_num_speculative_tokens; ++k) {
      MetricLabels l = labels;
      l.emplace_back("position", std::to_string(k));
      out.sample("peerserve:spec_decode_num_accepted_tokens_per_pos_total", l,
                 static_cast<double>(m.spec_decode_accepted_per_position[static_cast<size_t>(k)]));
    }
    out.histogram("peerserve:spec_decode_acceptance_length",
                  "Tokens emitted per speculative verification (1 + accepted drafts).", labels,
                  m.spec_decode_acceptance_length);
  }
  if (m.kv_pool_enabled) {
    const KvPoolCounters& p = m.kv_pool;
    out.counter("peerserve:kv_pool_lookups_total",
                "Requests whose prompt was looked up in the pool.", labels,
                static_cast<double>(p.loads));
    out.counter("peerserve:kv_pool_lookups_cancelled_total",
                "Lookups dropped before they started because their request was aborted.", labels,
                static_cast<double>(p.loads_cancelled));
    out.counter("peerserve:kv_pool_blocks_queried_total", "KV blocks asked of the caching pool.",
                labels, static_cast<double>(p.blocks_looked_up));
    out.counter("peerserve:kv_pool_blocks_hit_total",
                "KV blocks loaded from the caching pool (leading runs of hits).", labels,
                static_cast<double>(p.blocks_hit));
    out.counter("peerserve:kv_pool_hit_tokens_total",
                "Prompt tokens whose KV came from the caching pool.", labels,
                static_cast<double>(m.kv_pool_hit_tokens));
    out.counter("peerserve:kv_pool_bytes_loaded_total", "Bytes of KV loaded from the caching pool.",
                labels, static_cast<double>(p.bytes_loaded));
    out.counter("peerserve:kv_pool_blocks_stored_total", "KV blocks written to the caching pool.",
                labels, static_cast<double>(p.blocks_stored));
    out.counter("peerserve:kv_pool_bytes_stored_total", "Bytes of KV written to the caching pool.",
                labels, static_cast<double>(p.bytes_stored));
    out.counter("peerserve:kv_pool_store_failures_total",
                "KV block writes the caching pool refused or failed.", labels,
                static_cast<double>(p.store_failures));
    out.counter("peerserve:kv_pool_remote_prefills_total",
                "Prompts handed to a prefill instance (--role decode).", labels,
                static_cast<double>(p.remote_prefills));
    out.counter("peerserve:kv_pool_remote_prefill_failures_total",
                "Remote prefills that failed (the prompt was then computed here).", labels,
                static_cast<double>(p.remote_prefill_failures));
    out.counter("peerserve:kv_pool_remote_prefill_seconds_total",
                "Time spent waiting for remote prefills.", labels, p.remote_prefill_seconds_total);
    out.counter("peerserve:kv_handoff_blocks_total",
                "KV blocks prefill instances pushed straight into blocks reserved here "
                "(--role decode).",
                labels, static_cast<double>(p.handoff_blocks));
    out.counter("peerserve:kv_handoff_bytes_total", "Bytes of those blocks.", labels,
                static_cast<double>(p.handoff_bytes));
    out.counter("peerserve:kv_handoff_seconds_total",
                "Time from asking a prefill instance to the last pushed block received.", labels,
                p.handoff_seconds_total);
    out.counter("peerserve:kv_push_total",
                "Prompt KV hand-offs pushed to decode instances (--role prefill).", labels,
                static_cast<double>(p.pushes));
    out.counter("peerserve:kv_push_blocks_total", "KV blocks decode instances accepted.", labels,
                static_cast<double>(p.push_blocks));
    out.counter("peerserve:kv_push_bytes_total", "Bytes of those blocks.", labels,
                static_cast<double>(p.push_bytes));
    out.counter("peerserve:kv_push_seconds_total",
                "Time spent sending them (block-stream calls to decode instances).", labels,
                p.push_seconds_total);
    out.counter("peerserve:kv_push_failures_total",
                "Pushed KV blocks refused or not delivered (the decode instance computes them).",
                labels, static_cast<double>(p.push_failures));
    out.histogram("peerserve:kv_pool_load_seconds",
                  "Time a request waited for its caching-pool lookup.", labels,
                  m.kv_pool_load_latency);
  }
  out.gauge("peerserve:http_connections_open", "Open HTTP connections.", {},
            static_cast<double>(http.connections_open));
  out.counter("peerserve:http_requests_total", "HTTP requests received.", {},
              static_cast<double>(http.requests_total));
  out.counter("peerserve:http_slow_clients_dropped_total",
              "Connections dropped because the client stopped reading its output.", {},
              static_cast<double>(http.slow_clients_dropped));
  out.counter("peerserve:http_connections_refused_total",
              "Connections closed on accept: past the cap and the room kept for probes.", {},
              static_cast<double>(http.connections_refused));
  out.family("peerserve:http_responses_total", "HTTP responses by status code.", "counter");
  for (const auto& [status, count] : http.responses_by_status) {
    out.sample("peerserve:http_responses_total", {{"code", std::to_string(status)}},
               static_cast<double>(count));
  }
  return with_vllm_names(out.text());
}

std::string render_expert_load(const std::vector<int64_t>& counts, int64_t num_experts,
                               const std::string& model_name) {
  PrometheusText text;
  if (num_experts <= 0) return text.text();
  text.family("peerserve:moe_expert_tokens_total",
              "Tokens routed to each routed expert, per MoE layer (the load that expert "
              "placement balances).",
              "counter");
  const int64_t layers = static_cast<int64_t>(counts.size()) / num_experts;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t* row = counts.data() + layer * num_experts;
    bool any = false;
    for (int64_t e = 0; e < num_experts; ++e) any = any || row[e] != 0;
    if (!any) continue;
    for (int64_t e = 0; e < num_experts; ++e) {
      text.sample("peerserve:moe_expert_tokens_total",
                  {{"model_name", model_name},
                   {"layer", std::to_string(layer)},
                   {"expert", std::to_string(e)}},
                  static_cast<double>(row[e]));
    }
  }
  return text.text();
}

std::string render_data_parallel_load(const std::vector<int64_t>& running,
                                      const std::vector<int64_t>& routed_total,
                                      const std::string& model_name) {
  PrometheusText text;
  text.family("peerserve:dp_rank_running_sequences",
              "Unfinished sequences of each data-parallel rank (what the front end balances).",
              "gauge");
  for (size_t r = 0; r < running.size(); ++r) {
    text.sample("peerserve:dp_rank_running_sequences",
                {{"model_name", model_name}, {"rank", std::to_string(r)}},
                static_cast<double>(running[r]));
  }
  text.family("peerserve:dp_rank_requests_total",
              "Requests the front end handed to each data-parallel rank.", "counter");
  for (size_t r = 0; r < routed_total.size(); ++r) {
    text.sample("peerserve:dp_rank_requests_total",
                {{"model_name", model_name}, {"rank", std::to_string(r)}},
                static_cast<double>(routed_total[r]));
  }
  return text.text();
}

}  // namespace peerserve
