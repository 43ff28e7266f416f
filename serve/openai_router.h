// OpenAiRouter: `serve --role router`, the OpenAI front end over several decode instances
// (paper 000 §4.1: a stateless dispatcher; the caching pool makes every instance as good as
// another, so there is no cache-locality scheduling).
//
// Requests (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize) are
// passed to an instance chosen by RouterBackends and the answer comes back as it arrives:
// server-sent events chunk by chunk, other answers whole. A request that could not be
// delivered (refused, reset or timed out before the instance answered, or a 503 from an
// instance that is draining) is tried on the next instance; once the answer has started, a
// broken instance ends a stream with an error event and [DONE], and a whole answer with a
// 502 naming the instance. A client that goes away closes the connection to the instance,
// which aborts the request there and frees its KV.
//
// With --prefill the router also health-checks the prefill instances and names the least
// loaded one in each completion/chat request ("peerserve_prefill"); the decode instance tries
// it first if it is one of its own --prefill instances (the decode instance still schedules
// the prefill itself, §4.3.3; a prefill instance that fails is its fallback's business).
//
// GET /health: 200 while some decode instance is up; /metrics: per-instance state, requests in
// flight and failures, retries, and the prefill instances' state and suggestions.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "serve/http_server.h"
#include "serve/router_backends.h"
#include "serve/upstream_client.h"

namespace peerserve {

struct OpenAiRouterOptions {
  HttpServerOptions http;
  std::optional<std::string> api_key;  // checked by the router on /v1/ routes
  UpstreamTimeouts timeouts;
  // Whole (non-stream) answers kept at most before they go to the client (beyond: 502).
  uint64_t max_response_bytes = 64u << 20;
};

class OpenAiRouter {
 public:
  // `backends` must be checked (and started) by the caller; the router shares it. `prefill`
  // (may be null): prefill instances the router suggests to the decode instances, the least
  // loaded that is up, as "peerserve_prefill" in completion and chat requests (load: requests
  // whose answer has not started yet).
  static Result<std::unique_ptr<OpenAiRouter>> create(const OpenAiRouterOptions& options,
                                                      std::shared_ptr<RouterBackends> backends,
                                                      std::shared_ptr<RouterBackends> prefill = {});
  ~OpenAiRouter();

  uint16_t port() const;
  // Serves until stop(); blocks the calling thread.
  void run();
  void stop();
  // The end of a drain: the requests still in flight are cut off from their instances (a
  // stream ends with an error event, "shutting_down", and [DONE]; a whole answer gets 503),
  // what was handed to the clients gets up to `flush_limit` to be written out, then stop().
  // Blocks; call it from another thread than run()'s.
  void shut_down(std::chrono::milliseconds flush_limit);
  // New requests get 503 and /health 503 from now on; those in flight continue.
  void begin_drain();
  int64_t active_requests() const;

  struct Context;

 private:
  OpenAiRouter(std::shared_ptr<Context> context, std::unique_ptr<HttpServer> http);
  std::shared_ptr<Context> context_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace peerserve
