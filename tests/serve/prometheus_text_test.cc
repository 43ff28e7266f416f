#include "serve/prometheus_text.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

namespace peerserve {
namespace {

TEST(PrometheusTextTest, Numbers) {
  EXPECT_EQ(prometheus_number(3), "3");
  EXPECT_EQ(prometheus_number(0.1), "0.1");
  EXPECT_EQ(prometheus_number(1.0 / 0.0), "+Inf");
  EXPECT_EQ(prometheus_number(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(prometheus_number(0.0 / 0.0), "NaN");
}

TEST(PrometheusTextTest, LabelsAreEscaped) {
  PrometheusText t;
  t.gauge("g", "help", {{"model_name", "a\"b\\c\nd"}}, 1);
  EXPECT_EQ(t.text(), "# HELP g help\n# TYPE g gauge\ng{model_name=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(PrometheusTextTest, HistogramBucketsAreCumulative) {
  Histogram h({0.25, 1.0});
  for (double v : {0.125, 0.25, 0.5, 2.0, 3.0}) h.observe(v);
  PrometheusText t;
  t.histogram("lat_seconds", "latency", {{"m", "x"}}, h);
  // Hand-counted: <= 0.25: 2 (bounds are inclusive), <= 1: 3, all: 5; sum 5.875 (exact
  // in binary).
  const std::string expected =
      "# HELP lat_seconds latency\n"
      "# TYPE lat_seconds histogram\n"
      "lat_seconds_bucket{m=\"x\",le=\"0.25\"} 2\n"
      "lat_seconds_bucket{m=\"x\",le=\"1\"} 3\n"
      "lat_seconds_bucket{m=\"x\",le=\"+Inf\"} 5\n"
      "lat_seconds_sum{m=\"x\"} 5.875\n"
      "lat_seconds_count{m=\"x\"} 5\n";
  EXPECT_EQ(t.text(), expected);
}

TEST(PrometheusTextTest, ServerMetricsHaveEveryFamilyOnce) {
  EngineMetricsSnapshot m;
  m.scheduler.num_blocks = 10;
  m.scheduler.num_used_blocks = 4;
  m.scheduler.pool.prefix_query_tokens = 8;
  m.scheduler.pool.prefix_hit_tokens = 2;
  HttpServerCounters http;
  http.responses_by_status[200] = 3;
  const std::string text = render_server_metrics(m, http, "tiny");
  std::istringstream lines(text);
  std::string line;
  std::map<std::string, int> type_lines;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) ++type_lines[line.substr(7, line.find(' ', 7) - 7)];
  }
  for (const char* name :
       {"peerserve:num_requests_running", "peerserve:num_requests_waiting",
        "peerserve:kv_cache_blocks_used", "peerserve:kv_cache_blocks_free",
        "peerserve:prefix_cache_hit_rate", "peerserve:prompt_tokens_total",
        "peerserve:generation_tokens_total", "peerserve:num_preemptions_total",
        "peerserve:time_to_first_token_seconds", "peerserve:inter_token_latency_seconds",
        "peerserve:e2e_request_latency_seconds", "peerserve:http_responses_total"}) {
    EXPECT_EQ(type_lines[name], 1) << name;
  }
  EXPECT_NE(text.find("peerserve:kv_cache_blocks_used{model_name=\"tiny\"} 4\n"),
            std::string::npos);
  EXPECT_NE(text.find("peerserve:prefix_cache_hit_rate{model_name=\"tiny\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("peerserve:http_responses_total{code=\"200\"} 3\n"), std::string::npos);
}

// vLLM's names for the families it has (its dashboards and autoscalers read them), with the
// same samples; and every family's lines stay together, as the format requires.
TEST(PrometheusTextTest, ServerMetricsAlsoCarryVllmNames) {
  EngineMetricsSnapshot m;
  m.scheduler.num_running = 3;
  m.scheduler.num_blocks = 10;
  m.scheduler.num_used_blocks = 4;
  m.generation_tokens_total = 42;
  m.time_to_first_token.observe(0.02);
  m.requests_finished_total[static_cast<size_t>(FinishReason::kLength)] = 5;
  const std::string text = render_server_metrics(m, HttpServerCounters{}, "tiny");
  std::istringstream lines(text);
  std::string line, current;
  std::map<std::string, int> type_lines;
  std::vector<std::string> samples;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      ++type_lines[current];
      continue;
    }
    if (line.rfind("#", 0) == 0) continue;
    // Each sample belongs to the family whose TYPE line came last.
    EXPECT_EQ(line.rfind(current, 0), 0u) << line << " under " << current;
    samples.push_back(line);
  }
  for (const auto& [name, count] : type_lines) EXPECT_EQ(count, 1) << name;
  const auto has = [&](const std::string& sample) {
    return std::find(samples.begin(), samples.end(), sample) != samples.end();
  };
  for (const char* sample : {
           "vllm:num_requests_running{model_name=\"tiny\"} 3",
           "vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.4",
           "vllm:gpu_cache_usage_perc{model_name=\"tiny\"} 0.4",
           "vllm:generation_tokens_total{model_name=\"tiny\"} 42",
           "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 5",
           "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1",
           "vllm:time_to_first_token_seconds_sum{model_name=\"tiny\"} 0.02",
       }) {
    EXPECT_TRUE(has(sample)) << sample;
  }
  EXPECT_EQ(type_lines["vllm:time_to_first_token_seconds"], 1);
  EXPECT_EQ(type_lines.count("vllm:http_responses_total"), 0u);  // vLLM has no such family
}

}  // namespace
}  // namespace peerserve
