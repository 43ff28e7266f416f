// HttpServer: an asynchronous HTTP/1.1 server on Boost.Asio/Beast. One event-loop thread
// serves every connection, so hundreds of open SSE streams cost a socket and a little
// memory each, not a thread.
//
// The server parses requests (Beast, with a body size limit that answers 413 by itself),
// hands each one to the RequestHandler together with an HttpExchange, and writes what the
// handler sends back: a whole response, or a chunked stream (for server-sent events). The
// handler may answer later and from any thread (HttpExchange methods post to the
// connection's strand). When the client goes away before the response is complete, the
// exchange's disconnect callback runs, so the handler can abort the work behind it.
//
// Thread-safety: HttpExchange methods may be called from any thread. The handler runs on
// the event-loop thread and must not block.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace peerserve {

struct HttpServerOptions {
  std::string host = "127.0.0.1";      // Default: loopback only.
  uint16_t port = 8000;                // 0 = any free port (see HttpServer::port()).
  uint64_t max_body_bytes = 8u << 20;  // Larger bodies get 413. Default 8 MiB.
  // Further connections get 503 after one request, except GET /health and /metrics, which
  // are answered even then (a load balancer can still see the instance). The cap is lowered
  // at start-up when RLIMIT_NOFILE (raised to its hard limit) cannot hold it. Default 4096.
  int max_connections = 4096;
  // Connections from one client address at most (same treatment beyond it). Default 1024.
  int max_connections_per_client = 1024;
  // A new connection must deliver its first request's header within this time (idle or
  // trickling sockets are closed). Default 10 s.
  int header_timeout_seconds = 10;
  // Keep-alive connections idle this long between requests are closed. Default 30 s.
  int idle_timeout_seconds = 30;
  // A write that does not complete in this time (a client not reading) closes the
  // connection. Default 120 s.
  int write_timeout_seconds = 120;
  // Backpressure: output queued for one connection that the client has not read, at most.
  // Beyond it the client is treated as gone (its request is aborted and its KV freed)
  // instead of the output piling up in memory. Default 8 MiB.
  uint64_t max_unsent_bytes = 8u << 20;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, e.g. "/v1/models"
  std::string body;
  // Header names lowercased.
  std::map<std::string, std::string> headers;

  // The path without the query string.
  std::string path() const;
  const std::string* header(const std::string& lowercase_name) const;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // A whole response. extra_headers: name -> value.
  virtual void respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  // Starts a 200 chunked response; then write_chunk() any number of times and end_stream().
  virtual void start_stream(std::string content_type) = 0;
  virtual void write_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // The handler failed unexpectedly (an exception off the event loop): logs `what`, answers
  // 500 (or ends a stream already started) and closes the connection. The server goes on.
  virtual void fail(std::string what) = 0;

  // Runs `fn` on the connection's strand (serialised with every other callback of it).
  virtual void post(std::function<void()> fn) = 0;
  // `callback` runs once, on the strand, if the client disconnects before the response is
  // complete (immediately if it already has).
  virtual void on_disconnect(std::function<void()> callback) = 0;
  // Whether the client has gone away.
  virtual bool disconnected() const = 0;
};

using RequestHandler = std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;

struct HttpServerCounters {
  int64_t connections_open = 0;
  int64_t connections_total = 0;
  int64_t requests_total = 0;
  // Connections dropped because their client stopped reading (max_unsent_bytes).
  int64_t slow_clients_dropped = 0;
  // Connections closed on accept: past the cap and the room kept for probes.
  int64_t connections_refused = 0;
  // Responses by status code.
  std::map<int, int64_t> responses_by_status;
};

// Whether `host` (an IP address or a name) and `port` could be listened on now: a bad host or
// a port in use, found before a model takes minutes to load. (Another process may still take
// the port in between.)
Status check_listen_address(const std::string& host, int port);

class HttpServer {
 public:
  // Binds and listens (so port() is known before run()). Errors: bad host, port in use.
  static Result<std::unique_ptr<HttpServer>> create(const HttpServerOptions& options,
                                                    RequestHandler handler);
  ~HttpServer();

  uint16_t port() const;
  // Runs the event loop on the calling thread until stop().
  void run();
  // Stops accepting and ends the event loop; thread-safe.
  void stop();
  // Stops accepting, waits up to `limit` until every answer handed to a connection has been
  // written out (a slow reader still gets the end of its answer), then stop(). Blocks; call
  // it from another thread than run()'s.
  void stop_after_flush(std::chrono::milliseconds limit);

  HttpServerCounters counters() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
