#include "serve/openai_router.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/bearer_auth.h"
#include "serve/openai_protocol.h"
#include "serve/prometheus_text.h"

namespace peerserve {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";

struct OpenAiRouter::Context {
  OpenAiRouterOptions options;
  std::shared_ptr<RouterBackends> backends;
  std::shared_ptr<RouterBackends> prefill;  // null without --prefill
  std::unique_ptr<UpstreamClient> upstream;
  HttpServer* http = nullptr;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};
  std::atomic<int64_t> retries{0};      // requests moved to another instance
  std::atomic<int64_t> unavailable{0};  // requests no instance could take
  std::atomic<int64_t> broken{0};       // answers cut short by a failing instance
};

namespace {

void send_error(HttpExchange& exchange, const ApiError& error) {
  exchange.respond(error.status, kJson, api_error_json(error));
}

ApiError router_error(int status, std::string message, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = status == 503 ? "service_unavailable" : "server_error";
  e.code = std::move(code);
  return e;
}

// One client request and its way through the instances.
class ProxiedRequest : public std::enable_shared_from_this<ProxiedRequest> {
 public:
  // `prefill`: the prefill instance suggested in the request (its slot in ctx.prefill is
  // held until the decode instance's answer starts), or -1.
  ProxiedRequest(OpenAiRouter::Context& ctx, UpstreamRequest request,
                 std::shared_ptr<HttpExchange> exchange, int prefill)
      : ctx_(ctx),
        request_(std::move(request)),
        exchange_(std::move(exchange)),
        prefill_(prefill) {}

  void start() {
    ctx_.active.fetch_add(1);
    std::weak_ptr<ProxiedRequest> weak = weak_from_this();
    exchange_->on_disconnect([weak] {
      if (auto self = weak.lock()) self->client_gone();
    });
    try_next("");  // no error yet: with no instance up, the first try says so alone
  }

 private:
  void client_gone() {
    std::shared_ptr<UpstreamCall> call;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gone_ = true;
      call = call_;
    }
    if (call) call->cancel();  // the instance sees its client leave and aborts the request
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    release_prefill();
    ctx_.active.fetch_sub(1);
  }

  // The prompt has been prefilled once the decode instance answers (or it never will be).
  void release_prefill() {
    const int index = prefill_.exchange(-1);
    if (index >= 0) ctx_.prefill->release(index, false, "");
  }

  // Sends the request to the next instance not tried yet (on the caller's thread: the HTTP
  // loop for the first try, the upstream loop for retries).
  void try_next(const std::string& last_error) {
    uint64_t attempt = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (gone_) return finish();
      attempt = ++attempts_;
    }
    const int index = ctx_.backends->acquire(tried_);
    if (index < 0) {
      ctx_.unavailable.fetch_add(1);
      send_error(*exchange_,
                 tried_.empty() ? router_error(503, "no decode instance is up", "no_backend")
                                : router_error(hard_failures_ == 0 && saw_503_ ? 503 : 502,
                                               "no decode instance could take the request; last: " +
                                                   last_error,
                                               "backend_failed"));
      return finish();
    }
    if (!tried_.empty()) ctx_.retries.fetch_add(1);
    tried_.push_back(index);
    current_ = index;
    retry_after_503_ = false;
    streaming_ = false;
    body_.clear();
    UpstreamRequest request = request_;
    request.endpoint = ctx_.backends->endpoint(index);
    UpstreamCallbacks callbacks;
    auto self = shared_from_this();
    callbacks.on_header = [self](int status, const std::string& type) {
      self->on_header(status, type);
    };
    callbacks.on_data = [self](std::string data) { self->on_data(std::move(data)); };
    callbacks.on_done = [self](const Status& status, const UpstreamProgress& progress) {
      self->on_done(status, progress);
    };
    auto call =
        ctx_.upstream->start(std::move(request), ctx_.options.timeouts, std::move(callbacks));
    if (!call.ok()) {  // a malformed endpoint: create() validated them, so not expected
      ctx_.backends->release(index, true, call.status().message());
      return try_next(call.status().message());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // A call that failed at once has already run its retry (on the upstream thread), which
    // may have stored its own call: that one is the live one, to cancel on disconnect.
    if (attempt != attempts_) return;
    call_ = *call;
    if (gone_) call_->cancel();
  }

  void on_header(int status, const std::string& type) {
    status_ = status;
    content_type_ = type.empty() ? kJson : type;
    if (status == 503) {
      // Draining or overloaded: another instance may take it. The answer is dropped.
      saw_503_ = true;
      retry_after_503_ = true;
      std::lock_guard<std::mutex> lock(mutex_);
      if (call_) call_->cancel();
      return;
    }
    if (status == 200 && content_type_.rfind("text/event-stream", 0) == 0) {
      streaming_ = true;
      exchange_->start_stream(content_type_);
    }
  }

  void on_data(std::string data) {
    release_prefill();
    if (retry_after_503_ || overflow_) return;
    if (streaming_) {
      ends_with_event_ = data.size() >= 2 ? data.compare(data.size() - 2, 2, "\n\n") == 0
                                          : (ends_with_event_ && data.empty());
      exchange_->write_chunk(std::move(data));
      return;
    }
    if (body_.size() + data.size() > ctx_.options.max_response_bytes) {
      overflow_ = true;
      std::lock_guard<std::mutex> lock(mutex_);
      if (call_) call_->cancel();
      return;
    }
    body_ += data;
  }

  void on_done(const Status& status, const UpstreamProgress& progress) {
    const bool header_seen = progress.header_seen;
    const int index = current_;
    bool gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      call_.reset();
      gone = gone_;
    }
    const std::string& endpoint = ctx_.backends->endpoint(index);
    if (gone) {
      ctx_.backends->release(index, false, "");
      return finish();
    }
    if (retry_after_503_) {
      ctx_.backends->release(index, false, "");
      return try_next("decode instance " + endpoint + " answered 503 (draining or overloaded)");
    }
    if (overflow_) {
      ctx_.backends->release(index, false, "");
      ctx_.broken.fetch_add(1);
      send_error(*exchange_,
                 router_error(502,
                              "decode instance " + endpoint + " answered more than " +
                                  std::to_string(ctx_.options.max_response_bytes) + " bytes",
                              "backend_reply_too_large"));
      return finish();
    }
    if (status.ok()) {
      ctx_.backends->release(index, false, "");
      if (streaming_) {
        exchange_->end_stream();
      } else {
        exchange_->respond(status_, content_type_, std::move(body_));
      }
      return finish();
    }
    if (status.code() == StatusCode::kCancelled) {  // the router is shutting down
      ctx_.backends->release(index, false, "");
      if (streaming_) {
        // A complete event first, even if the instance's was cut in the middle of one.
        exchange_->write_chunk(
            std::string(ends_with_event_ ? "" : "\n\n") + "data: " +
            api_error_json(router_error(503, "the router is shutting down", "shutting_down")) +
            "\n\ndata: [DONE]\n\n");
        exchange_->end_stream();
      } else {
        send_error(*exchange_, router_error(503, "the router is shutting down", "shutting_down"));
      }
      return finish();
    }
    if (progress.sent && !header_seen && progress.timed_out) {
      // The instance has the request and may still be working on it (a long answer that is
      // not streamed sends nothing until it is whole): sending it elsewhere would generate it
      // twice or more, and the client would wait once per instance. Not taken for down; the
      // health checks judge that.
      ctx_.backends->release(index, false, "");
      ctx_.broken.fetch_add(1);
      send_error(*exchange_,
                 router_error(504,
                              "decode instance " + endpoint + " gave no answer in time (" +
                                  status.message() +
                                  "); not sent elsewhere, it may still be generating: stream "
                                  "the answer or raise --router-read-timeout-s",
                              "backend_timeout"));
      return finish();
    }
    ctx_.backends->release(index, true, status.message());
    ++hard_failures_;
    if (!header_seen) return try_next(status.message());  // nothing reached the client yet
    ctx_.broken.fetch_add(1);
    const ApiError error = router_error(
        502, "decode instance " + endpoint + " failed during the answer: " + status.message(),
        "backend_failed");
    if (streaming_) {
      // A complete event first, even if the instance broke off in the middle of one.
      exchange_->write_chunk(std::string(ends_with_event_ ? "" : "\n\n") +
                             "data: " + api_error_json(error) + "\n\ndata: [DONE]\n\n");
      exchange_->end_stream();
    } else {
      send_error(*exchange_, error);
    }
    finish();
  }

  OpenAiRouter::Context& ctx_;
  const UpstreamRequest request_;
  const std::shared_ptr<HttpExchange> exchange_;
  // Guards what the client's disconnect (HTTP loop) and the upstream loop both touch.
  std::mutex mutex_;
  std::shared_ptr<UpstreamCall> call_;  // the latest try's (see attempts_)
  uint64_t attempts_ = 0;               // tries begun, under mutex_
  bool gone_ = false;
  // The rest is touched by one thread at a time (the upstream loop after the first try).
  std::vector<int> tried_;
  int current_ = -1;
  bool retry_after_503_ = false, saw_503_ = false, streaming_ = false;
  bool overflow_ = false, ends_with_event_ = true, finished_ = false;
  std::atomic<int> prefill_;
  int status_ = 0;
  int hard_failures_ = 0;  // instances that failed (not just answered 503)
  std::string content_type_;
  std::string body_;
};

void proxy(OpenAiRouter::Context& ctx, const HttpRequest& request,
           std::shared_ptr<HttpExchange> exchange, const std::string& method) {
  if (ctx.draining.load()) {
    return send_error(*exchange, router_error(503, "the router is draining", "draining"));
  }
  UpstreamRequest upstream;
  upstream.method = method;
  upstream.target = request.target;
  int prefill = -1;
  if (method == "POST") {
    upstream.body = request.body;
    upstream.headers.emplace_back("Content-Type", kJson);
    // With --prefill: suggest the least-loaded prefill instance that is up to the decode
    // instance (it honours only instances of its own --prefill list). A body that is not a
    // JSON object goes as it came (the decode instance answers its error).
    const std::string path = request.path();
    if (ctx.prefill && (path == "/v1/completions" || path == "/v1/chat/completions")) {
      json body;
      const bool parsed = !parse_json_body(request.body, ApiLimits{}, &body).has_value();
      if (parsed && body.is_object() && !body.contains("peerserve_prefill")) {
        prefill = ctx.prefill->acquire({});
        if (prefill >= 0) {
          body["peerserve_prefill"] = ctx.prefill->endpoint(prefill);
          upstream.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
        }
      }
    }
  }
  if (const std::string* auth = request.header("authorization")) {
    upstream.headers.emplace_back("Authorization", *auth);
  }
  std::make_shared<ProxiedRequest>(ctx, std::move(upstream), std::move(exchange), prefill)->start();
}

std::string render_router_metrics(const OpenAiRouter::Context& ctx) {
  PrometheusText out;
  // One family: a sample per instance of `stats`, labelled `label`.
  auto per_instance = [&out](const std::vector<RouterBackendStats>& stats, const char* name,
                             const char* help, const char* type, const char* label, auto value) {
    out.family(name, help, type);
    for (const RouterBackendStats& s : stats) {
      out.sample(name, {{label, s.endpoint}}, static_cast<double>(value(s)));
    }
  };
  const std::vector<RouterBackendStats> stats = ctx.backends->stats();
  per_instance(stats, "peerserve:router_backend_up",
               "Whether the decode instance is in the rotation", "gauge", "backend",
               [](const RouterBackendStats& s) { return s.up; });
  per_instance(stats, "peerserve:router_backend_requests_in_flight",
               "Requests the router has open at the decode instance", "gauge", "backend",
               [](const RouterBackendStats& s) { return s.in_flight; });
  per_instance(stats, "peerserve:router_backend_requests_total",
               "Requests sent to the decode instance", "counter", "backend",
               [](const RouterBackendStats& s) { return s.requests; });
  per_instance(stats, "peerserve:router_backend_failures_total",
               "Requests the decode instance failed (refused, reset, timed out, malformed)",
               "counter", "backend", [](const RouterBackendStats& s) { return s.failures; });
  if (ctx.prefill) {
    const std::vector<RouterBackendStats> prefill = ctx.prefill->stats();
    per_instance(prefill, "peerserve:router_prefill_up",
                 "Whether the prefill instance is suggested", "gauge", "instance",
                 [](const RouterBackendStats& s) { return s.up; });
    per_instance(prefill, "peerserve:router_prefill_in_flight",
                 "Requests suggested to the prefill instance whose answer has not started", "gauge",
                 "instance", [](const RouterBackendStats& s) { return s.in_flight; });
    per_instance(prefill, "peerserve:router_prefill_requests_total",
                 "Requests the router suggested the prefill instance for", "counter", "instance",
                 [](const RouterBackendStats& s) { return s.requests; });
  }
  out.counter("peerserve:router_retries_total", "Requests moved to another decode instance", {},
              static_cast<double>(ctx.retries.load()));
  out.counter("peerserve:router_unavailable_total", "Requests no decode instance could take", {},
              static_cast<double>(ctx.unavailable.load()));
  out.counter("peerserve:router_broken_answers_total",
              "Answers cut short by a decode instance failing after it started", {},
              static_cast<double>(ctx.broken.load()));
  out.gauge("peerserve:router_requests_in_flight", "Client requests the router is serving", {},
            static_cast<double>(ctx.active.load()));
  if (ctx.http != nullptr) {
    const HttpServerCounters http = ctx.http->counters();
    out.gauge("peerserve:http_connections_open", "Open client connections", {},
              static_cast<double>(http.connections_open));
    out.family("peerserve:http_responses_total", "Responses by status code", "counter");
    for (const auto& [code, n] : http.responses_by_status) {
      out.sample("peerserve:http_responses_total", {{"code", std::to_string(code)}},
                 static_cast<double>(n));
    }
  }
  return out.text();
}

void route(OpenAiRouter::Context& ctx, HttpRequest request,
           std::shared_ptr<HttpExchange> exchange) {
  const std::string path = request.path();
  const std::string& method = request.method;
  if (path.rfind("/v1/", 0) == 0 && ctx.options.api_key &&
      !bearer_token_matches(request, *ctx.options.api_key)) {
    return exchange->respond(401, kJson, api_error_json(missing_api_key_error()),
                             {{"WWW-Authenticate", "Bearer"}});
  }
  const bool get_or_head = method == "GET" || method == "HEAD";
  auto wrong_method = [&](const std::string& allowed) {
    ApiError e;
    e.status = 405;
    e.message = "method " + method + " is not allowed on " + path + "; use " + allowed;
    e.code = "method_not_allowed";
    exchange->respond(405, kJson, api_error_json(e), {{"Allow", allowed}});
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
      path == "/detokenize") {
    if (method != "POST") return wrong_method("POST");
    return proxy(ctx, request, std::move(exchange), "POST");
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!get_or_head) return wrong_method("GET, HEAD");
    return proxy(ctx, request, std::move(exchange), "GET");
  }
  if (path == "/version") {
    if (!get_or_head) return wrong_method("GET, HEAD");
    return exchange->respond(200, kJson, json{{"version", PEERSERVE_VERSION}}.dump());
  }
  if (path == "/health") {
    if (!get_or_head) return wrong_method("GET, HEAD");
    if (ctx.draining.load()) {
      return send_error(*exchange, router_error(503, "the router is draining", "draining"));
    }
    if (!ctx.backends->any_up()) {
      return send_error(*exchange, router_error(503, "no decode instance is up", "no_backend"));
    }
    return exchange->respond(200, kJson, "{\"status\":\"ok\"}");
  }
  if (path == "/metrics") {
    if (!get_or_head) return wrong_method("GET, HEAD");
    return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8",
                             render_router_metrics(ctx));
  }
  ApiError e;
  e.status = 404;
  e.message = "unknown route " + method + " " + path;
  e.code = "not_found";
  send_error(*exchange, e);
}

}  // namespace

Result<std::unique_ptr<OpenAiRouter>> OpenAiRouter::create(
    const OpenAiRouterOptions& options, std::shared_ptr<RouterBackends> backends,
    std::shared_ptr<RouterBackends> prefill) {
  if (!backends) return invalid_argument("router: no decode instances");
  auto context = std::make_shared<Context>();
  context->options = options;
  context->backends = std::move(backends);
  context->prefill = std::move(prefill);
  context->upstream = std::make_unique<UpstreamClient>();
  Context* raw = context.get();
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<HttpServer> http,
      HttpServer::create(options.http,
                         [raw](HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
                           route(*raw, std::move(request), std::move(exchange));
                         }));
  context->http = http.get();
  return std::unique_ptr<OpenAiRouter>(new OpenAiRouter(std::move(context), std::move(http)));
}

OpenAiRouter::OpenAiRouter(std::shared_ptr<Context> context, std::unique_ptr<HttpServer> http)
    : context_(std::move(context)), http_(std::move(http)) {}

OpenAiRouter::~OpenAiRouter() {
  // Upstream calls first (their callbacks answer into connections of the HTTP server),
  // then the server and its connections.
  context_->upstream.reset();
  context_->http = nullptr;
  http_.reset();
}

uint16_t OpenAiRouter::port() const {
  return http_->port();
}
void OpenAiRouter::run() {
  http_->run();
}
void OpenAiRouter::stop() {
  http_->stop();
}
void OpenAiRouter::shut_down(std::chrono::milliseconds flush_limit) {
  context_->upstream->cancel_all();
  // Each cancelled call answers its client on the upstream loop: wait for those answers.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (context_->active.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_->stop_after_flush(flush_limit);
}
void OpenAiRouter::begin_drain() {
  context_->draining.store(true);
}
int64_t OpenAiRouter::active_requests() const {
  return context_->active.load();
}

}  // namespace peerserve
