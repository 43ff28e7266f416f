// OpenAiServer: the OpenAI-compatible HTTP API in front of an engine (an EngineClient: this
// process's Engine, or the data-parallel router of an expert-parallel job).
//
//   POST /v1/chat/completions   chat template -> tokens -> engine; JSON or SSE stream
//   POST /v1/completions        text / token-id prompts (batches too); JSON or SSE stream
//   GET  /v1/models             the served model
//   GET  /health                200 while the engine runs, else 503
//   GET  /metrics               Prometheus text (see prometheus_text.h)
//   POST /tokenize, /detokenize vLLM's shapes
//
// Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad JSON
// or parameters (and prompts longer than the context), 401 missing/wrong API key (routes
// under /v1/), 404 unknown model or route, 405 wrong method, 413 body too large, 429 queue
// full, 503 engine not running. A client that disconnects aborts its request in the
// engine, which frees its KV blocks.
//
// Lifetime: stop the engine before destroying the server (the engine's output sinks hold
// the server's connections).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/engine.h"
#include "serve/http_server.h"
#include "serve/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

struct OpenAiServerOptions {
  HttpServerOptions http;
  std::string served_model_name = "peerserve";  // the "model" clients must name
  std::optional<std::string> api_key;           // required as "Authorization: Bearer KEY"
  ApiLimits limits;
  // More /metrics text appended after the engine's (e.g. render_expert_load). Default: none.
  std::function<std::string()> extra_metrics;
  // KvNamespace::canonical_identity() of the engine's pool blocks, shown in the model card
  // (GET /v1/models) for the prefill/decode handshake. Default: none (not shown).
  std::string kv_namespace_identity;
  // Threads that parse, template and tokenize request bodies off the HTTP event loop.
  // Default 0: half the cores, 1 to 4.
  int request_threads = 0;
  // Bytes of request bodies accepted but not yet turned into engine requests, at most;
  // beyond it requests get 503 with Retry-After (one request is always admitted).
  // Default 256 MiB.
  uint64_t max_inflight_request_bytes = 256ull << 20;
  // Tool calling (tools/tool_choice in, tool_calls out, DeepSeek-V3 syntax; see
  // tool_call_parser.h). Off: requests that ask for tools get 400. Default on.
  bool tool_calling = true;
  // Testing hook: honour the request field peerserve_forced_output (the text the model is
  // made to produce). Never for production. Default off.
  bool allow_forced_output = false;
  // Prefill role: honour peerserve_kv_push (compute the prompt, then push its KV blocks to
  // the decode instance named there). Other roles refuse the field. Default off.
  bool accept_kv_push = false;
};

class OpenAiServer {
 public:
  // `engine` and `tokenizer` (may be null: token-id prompts only) must outlive the server.
  static Result<std::unique_ptr<OpenAiServer>> create(const OpenAiServerOptions& options,
                                                      EngineClient* engine,
                                                      const Tokenizer* tokenizer);
  ~OpenAiServer();

  uint16_t port() const { return http_->port(); }
  // Serves until stop(); blocks the calling thread.
  void run() { http_->run(); }
  void stop() { http_->stop(); }
  void stop_after_flush(std::chrono::milliseconds limit) { http_->stop_after_flush(limit); }
  // Graceful shutdown, first step: from now on new generations get 503 and /health 503
  // (a load balancer drains this instance); running ones continue.
  void begin_drain();
  // Generation calls (completions, chat) not finished yet.
  int64_t active_generations() const;

  struct Context;

 private:
  OpenAiServer(std::shared_ptr<Context> context, std::unique_ptr<HttpServer> http);
  std::shared_ptr<Context> context_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace peerserve
