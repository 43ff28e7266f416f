// UpstreamClient: asynchronous HTTP/1.1 calls to peer servers whose answers are passed on
// as they arrive — the router role forwarding a request to a decode instance and streaming
// its server-sent events back to the client.
//
// All calls share one event-loop thread (an SSE stream costs a socket and a little memory,
// not a thread). Every stage but the lookup of a host name (asio's resolver) has a
// deadline: connecting, writing the request, and each read
// (the response header, then every piece of the body), so a peer that is down, silent or
// sends garbage ends the call with an error naming it, never a hang. cancel() closes the
// connection, which the peer sees as its client going away (it aborts the work behind it).
//
// Thread-safety: start() and UpstreamCall::cancel() from any thread; the callbacks run on
// the client's event-loop thread, one call's callbacks never concurrently, and must not
// block.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace peerserve {

struct UpstreamRequest {
  std::string endpoint;  // "host:port"
  std::string method;    // "POST", "GET", ...
  std::string target;    // "/v1/completions"
  std::string body;
  // Sent besides Host, User-Agent and Content-Length (e.g. Content-Type, Authorization).
  std::vector<std::pair<std::string, std::string>> headers;
};

struct UpstreamTimeouts {
  std::chrono::milliseconds connect{2000};
  std::chrono::milliseconds write{10000};
  // Until the response header, and between two pieces of an event stream's body; for any
  // other body, the whole of it after the header.
  std::chrono::milliseconds read{300000};
};

// How far a call got before it ended.
struct UpstreamProgress {
  bool sent = false;         // the whole request was written: the peer may be working on it
  bool header_seen = false;  // on_header ran
  bool timed_out = false;    // it ended because a stage's deadline passed
};

struct UpstreamCallbacks {
  // The response header arrived: status and Content-Type.
  std::function<void(int status, const std::string& content_type)> on_header;
  // A piece of the body, in order, as it arrived (chunked framing removed).
  std::function<void(std::string data)> on_data;
  // Runs exactly once, last: OK when the whole response was read; Unavailable naming the
  // endpoint and the stage otherwise (refused, reset, timed out, malformed); Cancelled after
  // cancel(). `progress` says how far the call got.
  std::function<void(const Status& status, const UpstreamProgress& progress)> on_done;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Closes the connection; on_done follows (Cancelled) unless the call already ended.
  virtual void cancel() = 0;
};

class UpstreamClient {
 public:
  // Starts the event-loop thread.
  UpstreamClient();
  // Cancels the calls still running (each on_done runs) and joins the thread.
  ~UpstreamClient();
  UpstreamClient(const UpstreamClient&) = delete;
  UpstreamClient& operator=(const UpstreamClient&) = delete;

  // Cancels the calls running now (each on_done runs, Cancelled); new calls still start.
  void cancel_all();

  // InvalidArgument for a malformed endpoint or method (no callback runs then).
  Result<std::shared_ptr<UpstreamCall>> start(UpstreamRequest request, UpstreamTimeouts timeouts,
                                              UpstreamCallbacks callbacks);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
