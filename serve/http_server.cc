#include "serve/http_server.h"
#include "serve/http_buffer_limit.h"

#include <algorithm>
#include <atomic>

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace peerserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string HttpRequest::path() const {
  const size_t q = target.find('?');
  return q == std::string::npos ? target : target.substr(0, q);
}

const std::string* HttpRequest::header(const std::string& lowercase_name) const {
  auto it = headers.find(lowercase_name);
  return it == headers.end() ? nullptr : &it->second;
}

namespace {

// Past the connection cap, this many more are accepted for the load balancer's probes
// (GET /health, /metrics), each given at most kOverCapHeaderSeconds to send its request;
// beyond them a connection is closed on accept. Within the descriptors kept in reserve.
constexpr int64_t kOverCapConnections = 64;
constexpr int kOverCapHeaderSeconds = 2;

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string reason_phrase(int status) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return reason.empty() ? "Status" : std::string(reason);
}

// Printable ASCII without quotes or backslashes, at most 40 characters: safe inside the
// hand-written JSON below.
std::string sanitize_header_text(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 40)) {
    out += (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') ? c : '?';
  }
  return out;
}

// The first transfer coding other than chunked in the request's Transfer-Encoding fields
// (all of them, comma-separated lists included), or "" when chunked is the only one.
template <typename Message>
std::string non_chunked_coding(const Message& message) {
  const auto [first, last] = message.equal_range(http::field::transfer_encoding);
  for (auto field = first; field != last; ++field) {
    const std::string_view list(field->value().data(), field->value().size());
    size_t begin = 0;
    while (begin <= list.size()) {
      const size_t comma = std::min(list.find(',', begin), list.size());
      std::string_view coding = list.substr(begin, comma - begin);
      while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) {
        coding.remove_prefix(1);
      }
      while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) {
        coding.remove_suffix(1);
      }
      if (!coding.empty() &&
          !beast::iequals(beast::string_view(coding.data(), coding.size()), "chunked")) {
        return std::string(coding);
      }
      begin = comma + 1;
    }
  }
  return "";
}

std::string error_json(const std::string& message, const std::string& type,
                       const std::string& code) {
  // Minimal OpenAI-shaped error written without a JSON library (messages here are fixed).
  return "{\"error\":{\"message\":\"" + message + "\",\"type\":\"" + type +
         "\",\"param\":null,\"code\":\"" + code + "\"}}";
}

// The message of the exception being handled, for logs (never sent to clients).
std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  RequestHandler handler;
  // Declared before the io_context: sessions destroyed with it still update the counters.
  mutable std::mutex counters_mutex;
  HttpServerCounters counters;
  std::unordered_map<std::string, int> connections_per_client;  // under counters_mutex
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_backoff{ioc};
  uint16_t bound_port = 0;

  void do_accept();
  // Connections open from `client` after adding `delta`.
  int client_delta(const std::string& client, int delta) {
    std::lock_guard<std::mutex> lock(counters_mutex);
    int& n = connections_per_client[client];
    n += delta;
    const int now = n;
    if (n <= 0) connections_per_client.erase(client);
    return now;
  }
  int client_connections(const std::string& client) const {
    std::lock_guard<std::mutex> lock(counters_mutex);
    auto it = connections_per_client.find(client);
    return it == connections_per_client.end() ? 0 : it->second;
  }
  void count(int status) {
    std::lock_guard<std::mutex> lock(counters_mutex);
    ++counters.responses_by_status[status];
  }
  void connection_delta(int delta) {
    std::lock_guard<std::mutex> lock(counters_mutex);
    counters.connections_open += delta;
    if (delta > 0) counters.connections_total += delta;
  }
  int64_t open_connections() const {
    std::lock_guard<std::mutex> lock(counters_mutex);
    return counters.connections_open;
  }
  void count_request() {
    std::lock_guard<std::mutex> lock(counters_mutex);
    ++counters.requests_total;
  }
  void count_slow_client() {
    std::lock_guard<std::mutex> lock(counters_mutex);
    ++counters.slow_clients_dropped;
  }
  // Exchanges whose answer is not yet written out (or whose connection has not yet closed).
  std::atomic<int64_t> exchanges_in_flight{0};
  void count_refused_connection() {
    std::lock_guard<std::mutex> lock(counters_mutex);
    ++counters.connections_refused;
  }
};

namespace {

// After an early error answer, at most this much of the rest of a request is read and
// dropped (within the drain's 5 s) before the connection closes.
constexpr uint64_t kMaxDrainedBytes = 1 << 20;

class Session;

// The response side of one request on a session; forwards to the session's strand.
class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Session> session, uint64_t id) : session_(std::move(session)), id_(id) {}
  void respond(int status, std::string content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> extra_headers) override;
  void start_stream(std::string content_type) override;
  void write_chunk(std::string data) override;
  void end_stream() override;
  void fail(std::string what) override;
  void post(std::function<void()> fn) override;
  void on_disconnect(std::function<void()> callback) override;
  bool disconnected() const override;

 private:
  std::shared_ptr<Session> session_;
  uint64_t id_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::string client, HttpServer::Impl* server)
      : stream_(std::move(socket)), client_(std::move(client)), server_(server) {
    server_->connection_delta(+1);
    server_->client_delta(client_, +1);
  }
  ~Session() {
    set_in_exchange(false);
    server_->client_delta(client_, -1);
    server_->connection_delta(-1);
  }

  // over_limit: beyond a connection cap; the one request read is answered only if it is
  // GET /health or /metrics, everything else gets 503, and the connection closes.
  void start(bool over_limit) {
    over_limit_ = over_limit;
    do_read();
  }

  // Answers 503 and closes (too many connections).
  void reject() {
    close_after_write_ = true;
    respond(current_id_, 503, "application/json",
            error_json("too many open connections", "service_unavailable", "overloaded"),
            {{"Retry-After", "1"}});
  }

  auto executor() { return stream_.get_executor(); }
  bool peer_closed() const { return peer_closed_flag_.load(); }

  void respond(uint64_t id, int status, const std::string& content_type, const std::string& body,
               const std::vector<std::pair<std::string, std::string>>& extra_headers) {
    if (!accepting_writes(id)) return;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    head += "Content-Type: " + content_type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    bool retry_after = false;
    for (const auto& [name, value] : extra_headers) {
      head += name + ": " + value + "\r\n";
      retry_after = retry_after || beast::iequals(name, "Retry-After");
    }
    // Every 429 (a full queue, here or passed on by the router) says when to retry: clients
    // that honour it wait a second instead of retrying at once.
    if (status == 429 && !retry_after) head += "Retry-After: 1\r\n";
    head += (keep_alive_ && !close_after_write_) ? "Connection: keep-alive\r\n"
                                                 : "Connection: close\r\n";
    head += "\r\n";
    if (!head_request_) head += body;  // HEAD: the GET answer's headers, no body
    server_->count(status);
    response_complete_ = true;
    enqueue(std::move(head));
  }

  // Exception firewall: a handler (or a callback it posted) threw. Answer 500 if nothing
  // was sent yet, else end the stream; either way the connection closes and the server
  // keeps serving everyone else.
  void fail_exchange(uint64_t id, const std::string& what) {
    std::fprintf(stderr, "http: request handler threw (%s); answering 500\n", what.c_str());
    if (!accepting_writes(id)) return;
    close_after_write_ = true;
    if (streaming_) {
      end_stream(id);
      return;
    }
    respond(id, 500, "application/json",
            error_json("internal server error", "server_error", "internal_error"), {});
  }

  void start_stream(uint64_t id, const std::string& content_type) {
    if (!accepting_writes(id) || streaming_) return;
    streaming_ = true;
    std::string head =
        "HTTP/1.1 200 OK\r\nContent-Type: " + content_type + "\r\nCache-Control: no-cache\r\n";
    if (http10_) {
      // HTTP/1.0 has no chunked coding (RFC 9112 §6.1): the body ends when the connection does.
      keep_alive_ = false;
      close_after_write_ = true;
    } else {
      head += "Transfer-Encoding: chunked\r\n";
    }
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    head += "\r\n";
    server_->count(200);
    enqueue(std::move(head));
  }

  void write_chunk(uint64_t id, const std::string& data) {
    // An empty chunk would end the chunked body; skip it.
    if (!accepting_writes(id) || !streaming_ || data.empty() || head_request_) return;
    if (http10_) return enqueue(data);
    char size[20];
    const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    std::string chunk(size, static_cast<size_t>(n));
    chunk += data;
    chunk += "\r\n";
    enqueue(std::move(chunk));
  }

  void end_stream(uint64_t id) {
    if (!accepting_writes(id) || !streaming_) return;
    response_complete_ = true;
    enqueue(head_request_ || http10_ ? "" : "0\r\n\r\n");
  }

  void set_disconnect_callback(uint64_t id, std::function<void()> callback) {
    if (id != current_id_) return;
    if (peer_closed_) {
      if (callback) callback();
      return;
    }
    disconnect_callback_ = std::move(callback);
  }

 private:
  bool accepting_writes(uint64_t id) const {
    return id == current_id_ && in_exchange_ && !response_complete_ && !peer_closed_;
  }

  void do_read() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(64 * 1024);
    // A fresh connection gets the short header timeout (idle or trickling sockets must not
    // hold a slot); between keep-alive requests, the idle timeout.
    // Over the cap, a probe's request comes at once: its few slots must not be held long.
    stream_.expires_after(std::chrono::seconds(
        over_limit_ ? std::min(server_->options.header_timeout_seconds, kOverCapHeaderSeconds)
        : requests_read_ == 0 ? server_->options.header_timeout_seconds
                              : server_->options.idle_timeout_seconds));
    // The header first: a body over the limit is refused before it is sent, and clients
    // that wait for "100 Continue" (curl does for bodies over 1 KiB) get it at once.
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read(ec);
    // A Transfer-Encoding whose last coding is not chunked: Beast takes the body as empty
    // and the body's bytes as the next request (smuggling). RFC 9112 §6.3: 400, then close.
    if (parser_->get().count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
      return on_read(http::error::bad_transfer_encoding);
    }
    // A coding before chunked (gzip, chunked) would reach the handler still coded: RFC 9112
    // §6.1 answers 501, as Content-Encoding gets 415 below.
    if (const std::string coding = non_chunked_coding(parser_->get()); !coding.empty()) {
      return refuse(501, error_json("Transfer-Encoding '" + sanitize_header_text(coding) +
                                        "' is not supported; send the body plain or chunked",
                                    "invalid_request_error", "unsupported_transfer_coding"));
    }
    // RFC 9112 §3.2: an HTTP/1.1 request without a Host header is a 400.
    if (parser_->get().version() == 11 && parser_->get().count(http::field::host) == 0) {
      return refuse(400, error_json("an HTTP/1.1 request needs a Host header",
                                    "invalid_request_error", "bad_request"));
    }
    // Over a connection cap only the load balancer's probes are answered: refuse the rest
    // now, before a "100 Continue" and before reading a body (up to max_body_bytes each).
    if (over_limit_) {
      const auto& message = parser_->get();
      const std::string_view target(message.target().data(), message.target().size());
      const std::string_view path = target.substr(0, target.find('?'));
      if (message.method() != http::verb::get || (path != "/health" && path != "/metrics")) {
        keep_alive_ = false;
        close_after_write_ = true;
        set_in_exchange(true);
        response_complete_ = false;
        head_request_ = false;
        ++current_id_;
        return reject();
      }
    }
    const auto expect = parser_->get()[http::field::expect];
    if (!parser_->is_done() && beast::iequals(expect, "100-continue")) {
      continue_line_ = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(continue_line_),
                        [self = shared_from_this()](beast::error_code e, size_t) {
                          if (e) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    // The body may be large: give it its own (longer) deadline once the header is in.
    stream_.expires_after(
        std::chrono::seconds(std::max(60, server_->options.header_timeout_seconds)));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // A request refused before its body was read: the answer, then the connection closes (the
  // rest of the body is unread).
  void refuse(int status, std::string body) {
    head_request_ = false;  // a HEAD before it on this connection: this answer has a body
    keep_alive_ = false;
    close_after_write_ = true;
    set_in_exchange(true);
    response_complete_ = false;
    ++current_id_;
    respond(current_id_, status, "application/json", std::move(body), {});
  }

  void on_read(beast::error_code ec) {
    const bool parse_error =
        ec && ec.category() == http::make_error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message;
    if (parse_error) {
      if (ec == http::error::body_limit) {
        return refuse(413,
                      error_json("request body larger than " +
                                     std::to_string(server_->options.max_body_bytes) + " bytes",
                                 "invalid_request_error", "request_too_large"));
      }
      if (ec == http::error::header_limit) {
        return refuse(431, error_json("request headers too large", "invalid_request_error",
                                      "headers_too_large"));
      }
      return refuse(400,
                    error_json("malformed HTTP request", "invalid_request_error", "bad_request"));
    }
    if (ec) {
      close();
      return;
    }
    server_->count_request();
    auto& message = parser_->get();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.body = std::move(message.body());
    for (const auto& field : message) {
      const auto name = field.name_string();
      request.headers[lowercase(std::string_view(name.data(), name.size()))] =
          std::string(field.value());
    }
    keep_alive_ = message.keep_alive();
    http10_ = message.version() < 11;
    ++requests_read_;
    ++current_id_;
    set_in_exchange(true);
    streaming_ = false;
    response_complete_ = false;
    head_request_ = request.method == "HEAD";
    disconnect_callback_ = nullptr;
    stream_.expires_never();
    if (over_limit_) {
      // At a connection cap only the probes a load balancer needs are answered.
      close_after_write_ = true;
      keep_alive_ = false;
      const std::string path = request.path();
      if (request.method != "GET" || (path != "/health" && path != "/metrics")) return reject();
    }
    // A compressed body would reach the JSON parser as garbage: refuse it by name.
    if (const std::string* encoding = request.header("content-encoding");
        encoding != nullptr && !beast::iequals(*encoding, "identity")) {
      respond(current_id_, 415, "application/json",
              error_json("Content-Encoding '" + sanitize_header_text(*encoding) +
                             "' is not supported; send the body uncompressed",
                         "invalid_request_error", "unsupported_media_type"),
              {{"Accept-Encoding", "identity"}});
      return;
    }
    watch_for_disconnect();
    auto exchange = std::make_shared<Exchange>(shared_from_this(), current_id_);
    try {
      server_->handler(std::move(request), std::move(exchange));
    } catch (...) {
      fail_exchange(current_id_, current_exception_text());
    }
  }

  // A readable socket with nothing to read means the peer closed its side (or reset the
  // connection). (Pipelined bytes make it readable too; then we stop watching: the next read
  // sees them.) As in vLLM (uvicorn), the end of input before the answer is complete is a
  // client that left, streaming or not: its request is aborted rather than generated to
  // max_tokens for nobody. A client that only half-closes after its request is not answered.
  void watch_for_disconnect() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                         id = current_id_](beast::error_code ec) {
      if (ec || id != self->current_id_ || !self->in_exchange_ || self->peer_closed_) return;
      beast::error_code avail_ec;
      const size_t available = self->stream_.socket().available(avail_ec);
      if (avail_ec) return self->peer_gone();
      if (available > 0) return;       // a pipelined request: read after this response
      if (self->response_complete_) {  // whole, being written: send it, then close
        self->keep_alive_ = false;
        self->close_after_write_ = true;
        return;
      }
      self->peer_gone();
    });
  }

  void peer_gone() {
    if (peer_closed_) return;
    peer_closed_ = true;
    peer_closed_flag_.store(true);
    auto callback = std::move(disconnect_callback_);
    disconnect_callback_ = nullptr;
    if (in_exchange_ && !response_complete_ && callback) callback();
    close();
  }

  void enqueue(std::string data) {
    if (peer_closed_) return;
    const bool waiting = unsent_bytes_ > 0;  // earlier output the client has not taken yet
    unsent_bytes_ += data.size();
    // Only output piling up behind unsent output means a client that stopped reading: one
    // whole response larger than the limit (a /tokenize of a long text) was dropped unsent.
    if (waiting && unsent_bytes_ > server_->options.max_unsent_bytes) {
      // The client stopped reading: stop generating for it rather than buffer without bound.
      std::fprintf(stderr, "http: client %s is not reading (%llu bytes unsent); dropping it\n",
                   client_.c_str(), static_cast<unsigned long long>(unsent_bytes_));
      server_->count_slow_client();
      return peer_gone();
    }
    write_queue_.push_back(std::move(data));
    do_write();
  }

  void do_write() {
    if (writing_ || write_queue_.empty() || peer_closed_) return;
    // Coalesce everything queued into one write: many small SSE chunks, one syscall.
    writing_buffer_.clear();
    for (std::string& s : write_queue_) writing_buffer_ += s;
    write_queue_.clear();
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(server_->options.write_timeout_seconds));
    asio::async_write(
        stream_, asio::buffer(writing_buffer_),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    unsent_bytes_ -= std::min<uint64_t>(unsent_bytes_, writing_buffer_.size());
    if (ec) {
      peer_gone();
      return;
    }
    if (!write_queue_.empty()) {
      do_write();
      return;
    }
    stream_.expires_never();
    if (in_exchange_ && response_complete_) finish_exchange();
  }

  // Counts the exchanges whose answer is not yet written out, for stop_after_flush().
  void set_in_exchange(bool in) {
    if (in == in_exchange_) return;
    in_exchange_ = in;
    server_->exchanges_in_flight.fetch_add(in ? 1 : -1);
  }

  void finish_exchange() {
    set_in_exchange(false);
    streaming_ = false;
    disconnect_callback_ = nullptr;
    if (close_after_write_) {
      lingering_close();
      return;
    }
    if (!keep_alive_) {
      close();
      return;
    }
    do_read();
  }

  // After an early error answer (e.g. 413) the client may still be sending its body; closing
  // with unread data would reset the connection and could destroy our answer in flight. So
  // stop sending, read and drop what still arrives (bounded in time), then close.
  void lingering_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    // One deadline and a byte cap for the whole drain: renewing the deadline on every read
    // let a client trickling a byte every few seconds hold its connection slot forever.
    stream_.expires_after(std::chrono::seconds(5));
    drain_buffer_.resize(16 * 1024);
    drained_bytes_ = 0;
    drain();
  }
  void drain() {
    stream_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code e, size_t n) {
                              self->drained_bytes_ += n;
                              if (e || self->drained_bytes_ > kMaxDrainedBytes) {
                                self->close();
                              } else {
                                self->drain();
                              }
                            });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  std::string client_;  // the peer's address
  HttpServer::Impl* server_;
  bool over_limit_ = false;
  uint64_t requests_read_ = 0;
  beast::flat_buffer buffer_{kMaxUnparsedHttpBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> write_queue_;
  std::string writing_buffer_;
  uint64_t unsent_bytes_ = 0;  // queued or being written
  std::vector<char> drain_buffer_;
  uint64_t drained_bytes_ = 0;
  bool http10_ = false;  // the current request is HTTP/1.0: a stream is sent unchunked
  std::string continue_line_;
  bool writing_ = false;
  uint64_t current_id_ = 0;
  bool in_exchange_ = false;
  bool streaming_ = false;
  bool response_complete_ = false;
  bool keep_alive_ = true;
  bool head_request_ = false;
  bool close_after_write_ = false;
  bool peer_closed_ = false;
  std::atomic<bool> peer_closed_flag_{false};
  std::function<void()> disconnect_callback_;
};

void Exchange::respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> extra_headers) {
  asio::post(session_->executor(),
             [s = session_, id = id_, status, ct = std::move(content_type), b = std::move(body),
              h = std::move(extra_headers)] { s->respond(id, status, ct, b, h); });
}

void Exchange::start_stream(std::string content_type) {
  asio::post(session_->executor(),
             [s = session_, id = id_, ct = std::move(content_type)] { s->start_stream(id, ct); });
}

void Exchange::write_chunk(std::string data) {
  asio::post(session_->executor(),
             [s = session_, id = id_, d = std::move(data)] { s->write_chunk(id, d); });
}

void Exchange::end_stream() {
  asio::post(session_->executor(), [s = session_, id = id_] { s->end_stream(id); });
}

void Exchange::fail(std::string what) {
  asio::post(session_->executor(),
             [s = session_, id = id_, w = std::move(what)] { s->fail_exchange(id, w); });
}

void Exchange::post(std::function<void()> fn) {
  asio::post(session_->executor(), [s = session_, id = id_, fn = std::move(fn)] {
    try {
      fn();
    } catch (...) {
      s->fail_exchange(id, current_exception_text());
    }
  });
}

void Exchange::on_disconnect(std::function<void()> callback) {
  asio::post(session_->executor(), [s = session_, id = id_, cb = std::move(callback)]() mutable {
    s->set_disconnect_callback(id, std::move(cb));
  });
}

bool Exchange::disconnected() const {
  return session_->peer_closed();
}

}  // namespace

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE/ENFILE) or memory: the pending connection stays queued;
      // retrying at once would spin a core, so back off and let connections close.
      accept_backoff.expires_after(std::chrono::milliseconds(50));
      accept_backoff.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec) do_accept();
      });
      return;
    }
    beast::error_code nodelay_ec, endpoint_ec;
    socket.set_option(tcp::no_delay(true), nodelay_ec);
    const auto remote = socket.remote_endpoint(endpoint_ec);
    std::string client = endpoint_ec ? std::string("?") : remote.address().to_string();
    const int64_t open = open_connections();
    if (open >= static_cast<int64_t>(options.max_connections) + kOverCapConnections) {
      // Past the cap and the probes' room: closed at once, so a flood of idle sockets cannot
      // use up the descriptors (then nothing, /health included, could be accepted).
      beast::error_code close_ec;
      socket.close(close_ec);
      count_refused_connection();
      return do_accept();
    }
    const bool over_limit = open >= options.max_connections ||
                            client_connections(client) >= options.max_connections_per_client;
    std::make_shared<Session>(std::move(socket), std::move(client), this)->start(over_limit);
    do_accept();
  });
}

namespace {

// An IP address as it is, or an address of a host name, IPv4 first (vLLM's --host takes
// names too).
Result<tcp::endpoint> listen_endpoint(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return invalid_argument("--port " + std::to_string(port) + ": expected 0..65535");
  }
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(address, static_cast<uint16_t>(port));
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  const auto results = resolver.resolve(
      host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return invalid_argument("--host '" + host + "' is neither an IP address nor a name that " +
                            "resolves (" + (ec ? ec.message() : std::string("no address")) + ")");
  }
  // An IPv4 address first, as uvicorn binds a name: "localhost" listed as ::1 before
  // 127.0.0.1 would otherwise listen on IPv6 only, and probes of 127.0.0.1 would fail.
  for (const auto& entry : results) {
    if (entry.endpoint().address().is_v4()) return entry.endpoint();
  }
  return results.begin()->endpoint();
}

}  // namespace

Status check_listen_address(const std::string& host, int port) {
  PS_ASSIGN_OR_RETURN(const tcp::endpoint endpoint, listen_endpoint(host, port));
  asio::io_context ioc;
  tcp::acceptor probe(ioc);
  beast::error_code ec;
  probe.open(endpoint.protocol(), ec);
  if (!ec) probe.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) probe.bind(endpoint, ec);
  if (ec) {
    return unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                       ec.message());
  }
  return ok_status();
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(const HttpServerOptions& options,
                                                       RequestHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // Every connection is a descriptor: raise the soft limit to the hard one, and lower the
  // connection cap (saying so) when even that cannot hold it with room for files, the
  // engine's sockets and the pool.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    if (limit.rlim_cur < limit.rlim_max) {
      rlimit raised = limit;
      raised.rlim_cur = limit.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
    }
    constexpr rlim_t kReserve = 128;
    if (limit.rlim_cur != RLIM_INFINITY &&
        static_cast<rlim_t>(options.max_connections) + kReserve > limit.rlim_cur) {
      const int lowered =
          limit.rlim_cur > kReserve + 1 ? static_cast<int>(limit.rlim_cur - kReserve) : 1;
      std::fprintf(stderr,
                   "note: max connections lowered from %d to %d: the open-files limit "
                   "(RLIMIT_NOFILE) is %llu\n",
                   options.max_connections, lowered,
                   static_cast<unsigned long long>(limit.rlim_cur));
      impl->options.max_connections = lowered;
    }
  }
  impl->handler = std::move(handler);
  PS_ASSIGN_OR_RETURN(const tcp::endpoint endpoint, listen_endpoint(options.host, options.port));
  beast::error_code ec;
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return unavailable("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                       ": " + ec.message());
  }
  impl->bound_port = impl->acceptor.local_endpoint().port();
  impl->do_accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

uint16_t HttpServer::port() const {
  return impl_->bound_port;
}

void HttpServer::run() {
  impl_->ioc.run();
}

void HttpServer::stop() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->ioc.stop();
  });
}

void HttpServer::stop_after_flush(std::chrono::milliseconds limit) {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (impl_->exchanges_in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop();
}

HttpServerCounters HttpServer::counters() const {
  std::lock_guard<std::mutex> lock(impl_->counters_mutex);
  return impl_->counters;
}

}  // namespace peerserve
