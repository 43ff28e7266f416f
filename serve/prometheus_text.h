// Prometheus text exposition (format 0.0.4), written by hand: prometheus-cpp is not packaged
// in Debian 12, and the format is small (HELP/TYPE lines, samples with labels, histogram
// buckets with cumulative "le" counts plus _sum and _count).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/engine_metrics.h"
#include "serve/http_server.h"

namespace peerserve {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Writes the HELP and TYPE lines of a metric family ("counter", "gauge", "histogram").
  void family(std::string_view name, std::string_view help, std::string_view type);
  void sample(std::string_view name, const MetricLabels& labels, double value);
  // A family with a single sample.
  void counter(std::string_view name, std::string_view help, const MetricLabels& labels,
               double value);
  void gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
             double value);
  void histogram(std::string_view name, std::string_view help, const MetricLabels& labels,
                 const Histogram& histogram);

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Prometheus number syntax: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string prometheus_number(double value);
// Escapes a label value (backslash, double quote, newline).
std::string prometheus_escape(std::string_view value);

// Tokens routed to each expert of each MoE layer (counts [layer * num_experts + expert], as
// ExpertLoadRecorder keeps them), as peerserve:moe_expert_tokens_total{layer, expert};
// layers with no tokens at all are left out.
std::string render_expert_load(const std::vector<int64_t>& counts, int64_t num_experts,
                               const std::string& model_name);

// The data-parallel front end of an expert-parallel job: unfinished sequences on each rank
// (gauge) and requests handed to each rank (counter), as DataParallelRouter counts them.
std::string render_data_parallel_load(const std::vector<int64_t>& running,
                                      const std::vector<int64_t>& routed_total,
                                      const std::string& model_name);

// Forced tool calls (tool_choice "required" or a named function) whose schemas' pattern was
// over the automaton's bounds, as peerserve:forced_tool_call_fallbacks_total{constraint}:
// "any_object" (every tool's arguments any JSON object) and "none" (unconstrained).
std::string render_forced_tool_call_fallbacks(int64_t any_object, int64_t unconstrained,
                                              const std::string& model_name);

// Every metric the server exposes at /metrics, labelled with model_name.
std::string render_server_metrics(const EngineMetricsSnapshot& engine,
                                  const HttpServerCounters& http, const std::string& model_name);

}  // namespace peerserve
