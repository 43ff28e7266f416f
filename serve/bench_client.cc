#include "serve/bench_client.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>

namespace peerserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

Status BenchOptions::validate() const {
  if (num_prompts < 1) return invalid_argument("--num-prompts must be >= 1");
  if (!(request_rate > 0)) return invalid_argument("--request-rate must be > 0 (or inf)");
  if (max_concurrency < 0) return invalid_argument("--max-concurrency must be >= 0");
  if (input_len < 1) return invalid_argument("--input-len must be >= 1");
  if (output_len < 1) return invalid_argument("--output-len must be >= 1");
  // The prompts are built before the first request: bound what they take (4 bytes a token).
  constexpr int64_t kMaxPromptTokens = int64_t{1} << 28;  // 1 GiB of token ids
  if (input_len > (int64_t{1} << 24) || output_len > (int64_t{1} << 24)) {
    return invalid_argument("--input-len and --output-len must be at most 16777216");
  }
  if (int64_t{num_prompts} * input_len > kMaxPromptTokens) {
    return invalid_argument(
        "--num-prompts x --input-len = " + std::to_string(int64_t{num_prompts} * input_len) +
        " prompt tokens, more than " + std::to_string(kMaxPromptTokens) + " (1 GiB of token ids)");
  }
  if (!(prefix_share >= 0.0 && prefix_share <= 1.0)) {
    return invalid_argument("--prefix-share must be in [0, 1]");
  }
  if (token_low < 0 || token_high <= token_low) {
    return invalid_argument("token range [" + std::to_string(token_low) + ", " +
                            std::to_string(token_high) + ") is empty");
  }
  if (endpoint != "/v1/completions") {
    return invalid_argument(
        "--endpoint: only /v1/completions is supported (prompts are token ids)");
  }
  return ok_status();
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

std::vector<std::vector<int32_t>> make_bench_prompts(const BenchOptions& options) {
  std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ULL + 1);
  std::uniform_int_distribution<int32_t> token(options.token_low, options.token_high - 1);
  const int32_t shared =
      static_cast<int32_t>(std::lround(options.prefix_share * options.input_len));
  std::vector<int32_t> prefix(shared);
  for (int32_t& t : prefix) t = token(rng);
  std::vector<std::vector<int32_t>> prompts(options.num_prompts);
  for (auto& p : prompts) {
    p = prefix;
    while (static_cast<int32_t>(p.size()) < options.input_len) p.push_back(token(rng));
  }
  return prompts;
}

std::vector<double> make_arrival_times(const BenchOptions& options) {
  std::vector<double> times(options.num_prompts, 0.0);
  if (std::isinf(options.request_rate)) return times;
  std::mt19937_64 rng(options.seed * 0x2545f4914f6cdd1dULL + 7);
  std::exponential_distribution<double> gap(options.request_rate);
  double t = 0;
  for (double& x : times) {
    x = t;
    t += gap(rng);
  }
  return times;
}

namespace {

struct Endpoint {
  std::string host;
  std::string port;
  std::string base_path;
};

Result<Endpoint> parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return invalid_argument("--url '" + url + "': expected http://host:port");
  }
  std::string rest = url.substr(scheme.size());
  Endpoint e;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    e.base_path = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!e.base_path.empty() && e.base_path.back() == '/') e.base_path.pop_back();
  }
  const size_t colon = rest.rfind(':');
  e.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  e.port = colon == std::string::npos ? "80" : rest.substr(colon + 1);
  if (e.host.empty() || e.port.empty()) {
    return invalid_argument("--url '" + url + "': expected http://host:port");
  }
  return e;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct RequestRecord {
  bool ok = false;
  std::string error;
  double start = 0;
  double ttft = -1;
  double end = 0;
  std::vector<double> itls;
  std::vector<double> tbts;  // per token: a chunk's gap over the tokens it carries
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;
};

class BenchRun;

// One streamed request on its own connection.
class StreamedRequest : public std::enable_shared_from_this<StreamedRequest> {
 public:
  StreamedRequest(BenchRun* run, int32_t index, std::string body);
  void start();

 private:
  void on_connect(beast::error_code ec);
  void on_write(beast::error_code ec);
  void read_more();
  void on_read(beast::error_code ec);
  void consume_events(double now);
  void done(std::string error);

  BenchRun* run_;
  int32_t index_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::optional<http::response_parser<http::string_body>> parser_;
  std::function<uint64_t(uint64_t, beast::string_view, beast::error_code&)> on_chunk_;
  std::string sse_;
  double last_token_time_ = 0;
  int64_t counted_tokens_ = 0;  // completion tokens seen in the running usage
  double last_count_time_ = 0;
  bool saw_done_ = false;
  bool finished_ = false;
  std::string stream_error_;
};

class BenchRun {
 public:
  BenchRun(const BenchOptions& options, Endpoint endpoint, std::string model,
           const BenchProgress& progress)
      : options_(options),
        endpoint_(std::move(endpoint)),
        model_(std::move(model)),
        progress_(progress),
        timer_(ioc_) {}

  Result<BenchReport> run() {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    resolved_ = resolver.resolve(endpoint_.host, endpoint_.port, ec);
    if (ec) {
      return unavailable("cannot resolve " + endpoint_.host + ":" + endpoint_.port + ": " +
                         ec.message());
    }
    prompts_ = make_bench_prompts(options_);
    arrivals_ = make_arrival_times(options_);
    records_.resize(options_.num_prompts);
    t0_ = std::chrono::steady_clock::now();
    pump();
    ioc_.run();
    return report(seconds_since(t0_));
  }

  asio::io_context& ioc() { return ioc_; }
  const tcp::resolver::results_type& resolved() const { return resolved_; }
  const Endpoint& endpoint() const { return endpoint_; }
  const BenchOptions& options() const { return options_; }
  RequestRecord& record(int32_t i) { return records_[i]; }
  double now() const { return seconds_since(t0_); }

  void request_done() {
    --in_flight_;
    ++done_;
    if (progress_) progress_(done_, options_.num_prompts);
    pump();
  }

 private:
  void pump() {
    const int32_t cap = options_.max_concurrency > 0 ? options_.max_concurrency : INT32_MAX;
    while (next_ < options_.num_prompts && in_flight_ < cap && arrivals_[next_] <= now()) {
      launch(next_++);
    }
    if (next_ < options_.num_prompts && in_flight_ < cap) {
      const double wait = std::max(0.0, arrivals_[next_] - now());
      timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(wait)));
      timer_.async_wait([this](beast::error_code ec) {
        if (!ec) pump();
      });
    }
  }

  void launch(int32_t i) {
    json body = {{"model", model_},
                 {"prompt", prompts_[i]},
                 {"max_tokens", options_.output_len},
                 {"temperature", 0.0},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (options_.continuous_usage) body["stream_options"]["continuous_usage_stats"] = true;
    records_[i].start = now();
    records_[i].input_tokens = static_cast<int64_t>(prompts_[i].size());
    ++in_flight_;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    std::make_shared<StreamedRequest>(this, i, body.dump())->start();
  }

  BenchReport report(double duration) const {
    BenchReport r;
    r.duration_s = duration;
    r.max_in_flight = max_in_flight_;
    std::vector<double> ttfts, tpots, itls, tbts, e2els;
    for (const RequestRecord& rec : records_) {
      if (!rec.ok) {
        ++r.failed;
        if (r.first_errors.size() < 5) r.first_errors.push_back(rec.error);
        continue;
      }
      ++r.completed;
      r.total_input_tokens += rec.input_tokens;
      r.total_output_tokens += rec.output_tokens;
      r.cached_prompt_tokens += rec.cached_tokens;
      const double ttft = rec.ttft >= 0 ? rec.ttft : rec.end - rec.start;
      const double e2el = rec.end - rec.start;
      const double tpot =
          rec.output_tokens > 1 ? (e2el - ttft) / static_cast<double>(rec.output_tokens - 1) : 0.0;
      ttfts.push_back(ttft * 1e3);
      e2els.push_back(e2el * 1e3);
      if (rec.output_tokens > 1) tpots.push_back(tpot * 1e3);
      for (double x : rec.itls) itls.push_back(x * 1e3);
      for (double x : rec.tbts) tbts.push_back(x * 1e3);
      const bool good = (!options_.slo_ttft_ms || ttft * 1e3 <= *options_.slo_ttft_ms) &&
                        (!options_.slo_tpot_ms || tpot * 1e3 <= *options_.slo_tpot_ms) &&
                        (!options_.slo_e2el_ms || e2el * 1e3 <= *options_.slo_e2el_ms);
      if (good) ++r.good_requests;
    }
    auto summarize = [](const std::vector<double>& v) {
      LatencySummary s;
      s.count = static_cast<int64_t>(v.size());
      if (v.empty()) return s;
      double sum = 0;
      for (double x : v) sum += x;
      s.mean = sum / static_cast<double>(v.size());
      s.p50 = percentile(v, 50);
      s.p90 = percentile(v, 90);
      s.p99 = percentile(v, 99);
      return s;
    };
    r.ttft = summarize(ttfts);
    r.tpot = summarize(tpots);
    r.itl = summarize(itls);
    r.tbt = summarize(tbts);
    r.e2el = summarize(e2els);
    if (duration > 0) {
      r.request_throughput = r.completed / duration;
      r.output_throughput = static_cast<double>(r.total_output_tokens) / duration;
      r.total_token_throughput =
          static_cast<double>(r.total_input_tokens + r.total_output_tokens) / duration;
      r.goodput = r.good_requests / duration;
    }
    return r;
  }

  BenchOptions options_;
  Endpoint endpoint_;
  std::string model_;
  BenchProgress progress_;
  asio::io_context ioc_;
  asio::steady_timer timer_;
  tcp::resolver::results_type resolved_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<double> arrivals_;
  std::vector<RequestRecord> records_;
  std::chrono::steady_clock::time_point t0_;
  int32_t next_ = 0;
  int32_t in_flight_ = 0;
  int32_t max_in_flight_ = 0;
  int32_t done_ = 0;
};

StreamedRequest::StreamedRequest(BenchRun* run, int32_t index, std::string body)
    : run_(run), index_(index), stream_(run->ioc()) {
  request_.method(http::verb::post);
  request_.target(run->endpoint().base_path + run->options().endpoint);
  request_.version(11);
  request_.set(http::field::host, run->endpoint().host);
  request_.set(http::field::content_type, "application/json");
  request_.set(http::field::connection, "close");
  if (!run->options().api_key.empty()) {
    request_.set(http::field::authorization, "Bearer " + run->options().api_key);
  }
  request_.body() = std::move(body);
  request_.prepare_payload();
}

void StreamedRequest::start() {
  stream_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(run_->options().request_timeout_seconds)));
  stream_.async_connect(run_->resolved(),
                        [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                          self->on_connect(ec);
                        });
}

void StreamedRequest::on_connect(beast::error_code ec) {
  if (ec) return done("connect: " + ec.message());
  stream_.socket().set_option(tcp::no_delay(true), ec);
  http::async_write(stream_, request_, [self = shared_from_this()](beast::error_code e, size_t) {
    self->on_write(e);
  });
}

void StreamedRequest::on_write(beast::error_code ec) {
  if (ec) return done("write: " + ec.message());
  parser_.emplace();
  // Not boost::none: Boost 1.74 (Debian 12) compares a Content-Length with an empty limit as
  // "larger than the limit", so no error reply could be read. Streamed bodies are consumed
  // by on_chunk_body; an error body is cut to 300 bytes when shown.
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  on_chunk_ = [this](uint64_t, beast::string_view body, beast::error_code&) -> uint64_t {
    sse_.append(body.data(), body.size());
    return body.size();
  };
  parser_->on_chunk_body(on_chunk_);
  read_more();
}

void StreamedRequest::read_more() {
  http::async_read_some(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void StreamedRequest::on_read(beast::error_code ec) {
  const double now = run_->now();
  consume_events(now);
  if (ec == http::error::end_of_stream && parser_->is_done()) ec = {};
  if (ec) return done("read: " + ec.message());
  if (!parser_->is_done()) return read_more();
  const unsigned status = parser_->get().result_int();
  if (status != 200) {
    std::string body = parser_->get().body();
    if (body.size() > 300) body = body.substr(0, 300);
    return done("HTTP " + std::to_string(status) + ": " + body);
  }
  if (!stream_error_.empty()) return done(stream_error_);
  if (!saw_done_) return done("stream ended without [DONE]");
  done("");
}

void StreamedRequest::consume_events(double now) {
  RequestRecord& rec = run_->record(index_);
  size_t pos;
  while ((pos = sse_.find("\n\n")) != std::string::npos) {
    const std::string event = sse_.substr(0, pos);
    sse_.erase(0, pos + 2);
    if (event.rfind("data:", 0) != 0) continue;
    std::string payload = event.substr(5);
    if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
    if (payload == "[DONE]") {
      saw_done_ = true;
      continue;
    }
    json chunk = json::parse(payload, nullptr, false);
    if (chunk.is_discarded()) {
      stream_error_ = "bad JSON in the stream";
      continue;
    }
    if (chunk.contains("error")) {
      stream_error_ = "error event: " + chunk["error"].dump();
      continue;
    }
    // As vLLM's benchmark: every chunk with a choice counts, its text may be empty (a token
    // whose text the server holds back); the usage-only chunk at the end does not.
    const bool has_choice =
        chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty();
    if (has_choice) {
      if (rec.ttft < 0) {
        rec.ttft = now - rec.start;
      } else {
        rec.itls.push_back(now - last_token_time_);
      }
      last_token_time_ = now;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      const json& u = chunk["usage"];
      rec.output_tokens = u.value("completion_tokens", int64_t{0});
      if (rec.output_tokens > counted_tokens_) {
        // The tokens this chunk brought share its gap (the first ones are in TTFT instead).
        if (counted_tokens_ > 0) {
          const int64_t added = rec.output_tokens - counted_tokens_;
          for (int64_t k = 0; k < added; ++k) {
            rec.tbts.push_back((now - last_count_time_) / static_cast<double>(added));
          }
        }
        counted_tokens_ = rec.output_tokens;
        last_count_time_ = now;
      }
      rec.input_tokens = u.value("prompt_tokens", rec.input_tokens);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        rec.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
      }
    }
  }
}

void StreamedRequest::done(std::string error) {
  if (finished_) return;
  finished_ = true;
  RequestRecord& rec = run_->record(index_);
  rec.end = run_->now();
  rec.ok = error.empty();
  rec.error = std::move(error);
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
  run_->request_done();
}

// GET /v1/models; returns the first model id. Bounded by `timeout` as a whole.
Result<std::string> first_model(const Endpoint& endpoint, const std::string& api_key,
                                std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  tcp::resolver resolver(ioc);
  http::request<http::string_body> req(http::verb::get, endpoint.base_path + "/v1/models", 11);
  req.set(http::field::host, endpoint.host);
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  const std::string no_answer =
      "GET /v1/models: no answer within " + std::to_string(timeout.count()) + " ms";
  std::string failed;  // the step that failed and why
  const auto fail = [&](const std::string& step, beast::error_code ec) {
    failed = ec == beast::error::timeout ? no_answer : step + ": " + ec.message();
  };
  resolver.async_resolve(endpoint.host, endpoint.port, [&](beast::error_code ec, auto results) {
    if (ec) return fail("cannot resolve", ec);
    stream.async_connect(results, [&](beast::error_code ec, const auto&) {
      if (ec) return fail("cannot connect", ec);
      http::async_write(stream, req, [&](beast::error_code ec, size_t) {
        if (ec) return fail("GET /v1/models failed", ec);
        http::async_read(stream, buffer, parser, [&](beast::error_code ec, size_t) {
          if (ec) fail("GET /v1/models failed", ec);
        });
      });
    });
  });
  stream.expires_after(timeout);  // connect, write and read; the resolver is stopped below
  ioc.run_for(timeout + std::chrono::milliseconds(100));
  if (!ioc.stopped()) {
    resolver.cancel();
    ioc.stop();
    failed = no_answer;
  }
  if (!failed.empty()) {
    return unavailable(endpoint.host + ":" + endpoint.port + ": " + failed);
  }
  const auto& res = parser.get();
  json body = json::parse(res.body(), nullptr, false);
  if (res.result_int() != 200 || body.is_discarded() || !body.contains("data") ||
      !body["data"].is_array() || body["data"].empty() || !body["data"][0].is_object()) {
    return unavailable("GET /v1/models returned " + std::to_string(res.result_int()) + ": " +
                       res.body().substr(0, 200));
  }
  const json& id = body["data"][0]["id"];
  if (!id.is_string()) return unavailable("GET /v1/models: the first model has no string id");
  return id.get<std::string>();
}

std::string fmt_double(double v, int precision = 2) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

}  // namespace

nlohmann::json BenchReport::to_json(const BenchOptions& options) const {
  auto summary = [](const LatencySummary& s) {
    return json{{"mean_ms", s.mean},
                {"p50_ms", s.p50},
                {"p90_ms", s.p90},
                {"p99_ms", s.p99},
                {"count", s.count}};
  };
  json config = {
      {"url", options.url},
      {"endpoint", options.endpoint},
      {"num_prompts", options.num_prompts},
      {"request_rate", std::isinf(options.request_rate) ? json("inf") : json(options.request_rate)},
      {"max_concurrency", options.max_concurrency},
      {"input_len", options.input_len},
      {"output_len", options.output_len},
      {"prefix_share", options.prefix_share},
      {"seed", options.seed}};
  json slos = json::object();
  if (options.slo_ttft_ms) slos["ttft_ms"] = *options.slo_ttft_ms;
  if (options.slo_tpot_ms) slos["tpot_ms"] = *options.slo_tpot_ms;
  if (options.slo_e2el_ms) slos["e2el_ms"] = *options.slo_e2el_ms;
  return {{"config", config},
          {"duration_s", duration_s},
          {"completed", completed},
          {"failed", failed},
          {"errors", first_errors},
          {"total_input_tokens", total_input_tokens},
          {"total_output_tokens", total_output_tokens},
          {"cached_prompt_tokens", cached_prompt_tokens},
          {"request_throughput", request_throughput},
          {"output_throughput", output_throughput},
          {"total_token_throughput", total_token_throughput},
          {"slos", slos},
          {"good_requests", good_requests},
          {"goodput", goodput},
          {"max_in_flight", max_in_flight},
          {"ttft", summary(ttft)},
          {"tpot", summary(tpot)},
          {"itl", summary(itl)},
          {"tbt", summary(tbt)},
          {"e2el", summary(e2el)}};
}

std::string BenchReport::to_text(const BenchOptions& options) const {
  std::string out;
  auto line = [&](const std::string& name, const std::string& value) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-36s %s\n", name.c_str(), value.c_str());
    out += buf;
  };
  out += "============ Serving Benchmark Result ============\n";
  line("Successful requests:", std::to_string(completed));
  line("Failed requests:", std::to_string(failed));
  line("Benchmark duration (s):", fmt_double(duration_s));
  line("Total input tokens:", std::to_string(total_input_tokens));
  line("Total generated tokens:", std::to_string(total_output_tokens));
  line("Cached prompt tokens (server):", std::to_string(cached_prompt_tokens));
  line("Request throughput (req/s):", fmt_double(request_throughput));
  line("Output token throughput (tok/s):", fmt_double(output_throughput));
  line("Total token throughput (tok/s):", fmt_double(total_token_throughput));
  if (options.slo_ttft_ms || options.slo_tpot_ms || options.slo_e2el_ms) {
    line("Request goodput (req/s):", fmt_double(goodput));
  }
  line("Max requests in flight:", std::to_string(max_in_flight));
  auto block = [&](const char* title, const char* name, const LatencySummary& s) {
    out += std::string("--------------- ") + title + " ---------------\n";
    line(std::string("Mean ") + name + " (ms):", fmt_double(s.mean));
    line(std::string("Median ") + name + " (ms):", fmt_double(s.p50));
    line(std::string("P90 ") + name + " (ms):", fmt_double(s.p90));
    line(std::string("P99 ") + name + " (ms):", fmt_double(s.p99));
  };
  block("Time to First Token", "TTFT", ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", tpot);
  block("Inter-token Latency", "ITL", itl);
  if (tbt.count > 0) block("Time Between Tokens (per token)", "TBT", tbt);
  block("End-to-end Latency", "E2EL", e2el);
  out += "==================================================\n";
  for (const std::string& e : first_errors) out += "error: " + e + "\n";
  return out;
}

Result<BenchReport> run_bench(const BenchOptions& options, const BenchProgress& progress) {
  PS_RETURN_IF_ERROR(options.validate());
  PS_ASSIGN_OR_RETURN(Endpoint endpoint, parse_url(options.url));
  std::string model = options.model;
  if (model.empty()) {
    PS_ASSIGN_OR_RETURN(model,
                        first_model(endpoint, options.api_key,
                                    std::chrono::milliseconds(static_cast<int64_t>(
                                        std::min(options.request_timeout_seconds, 60.0) * 1000))));
  }
  BenchRun run(options, endpoint, model, progress);
  return run.run();
}

}  // namespace peerserve
