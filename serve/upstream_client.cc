#include "serve/upstream_client.h"
#include "serve/http_buffer_limit.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

namespace peerserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

class Call;

}  // namespace

struct UpstreamClient::Impl {
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  // Calls not finished yet; touched on the event-loop thread only.
  std::unordered_map<Call*, std::weak_ptr<Call>> live;
  std::thread thread;
};

namespace {

class Call final : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(UpstreamClient::Impl& client, UpstreamRequest request, UpstreamTimeouts timeouts,
       UpstreamCallbacks callbacks, std::string host, std::string port, http::verb verb)
      : client_(client),
        resolver_(client.ioc),
        stream_(client.ioc),
        endpoint_(std::move(request.endpoint)),
        method_(std::move(request.method)),
        target_(std::move(request.target)),
        timeouts_(timeouts),
        callbacks_(std::move(callbacks)),
        host_(std::move(host)),
        port_(std::move(port)) {
    request_ = http::request<http::string_body>(verb, target_, 11);
    request_.set(http::field::host, host_);
    request_.set(http::field::user_agent, "peerserve");
    for (auto& [name, value] : request.headers) request_.set(name, value);
    request_.body() = std::move(request.body);
    request_.prepare_payload();
    // The caller bounds what it keeps. Not boost::none: Boost compares a Content-Length
    // with an empty optional as "larger than the limit" (Debian 12 ships Boost 1.74).
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  void begin() {
    client_.live[this] = weak_from_this();
    resolver_.async_resolve(
        host_, port_,
        [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type results) {
          self->on_resolved(ec, std::move(results));
        });
  }

  void cancel() override {
    asio::post(client_.ioc, [self = shared_from_this()] {
      self->finish(Status(StatusCode::kCancelled, self->describe() + ": cancelled"));
    });
  }

  // Ends the call (once): closes the connection and reports. Event-loop thread only.
  void finish(const Status& status) {
    if (finished_) return;
    finished_ = true;
    client_.live.erase(this);
    beast::error_code ignored;
    resolver_.cancel();
    stream_.socket().close(ignored);
    if (callbacks_.on_done) callbacks_.on_done(status, progress_);
    callbacks_ = {};  // drop what the callbacks hold (exchanges, buffers) now
  }

 private:
  std::string describe() const { return method_ + " http://" + endpoint_ + target_; }

  void fail(const char* stage, beast::error_code ec, std::chrono::milliseconds limit) {
    if (finished_) return;  // closed by cancel(): already reported
    progress_.timed_out = ec == beast::error::timeout;
    std::string why = ec == beast::error::timeout
                          ? "no answer within " + std::to_string(limit.count()) + " ms"
                          : ec.message();
    finish(unavailable(describe() + ": " + stage + ": " + why));
  }

  void on_resolved(beast::error_code ec, tcp::resolver::results_type results) {
    if (finished_) return;
    if (ec) return fail("resolve", ec, timeouts_.connect);
    stream_.expires_after(timeouts_.connect);
    stream_.async_connect(
        results, [self = shared_from_this()](beast::error_code e, const tcp::endpoint&) {
          if (self->finished_) return;
          if (e) return self->fail("connect", e, self->timeouts_.connect);
          self->stream_.expires_after(self->timeouts_.write);
          http::async_write(self->stream_, self->request_, [self](beast::error_code e2, size_t) {
            if (self->finished_) return;
            if (e2) return self->fail("write", e2, self->timeouts_.write);
            self->request_ = {};  // the body is sent: free it
            self->progress_.sent = true;
            self->stream_.expires_after(self->timeouts_.read);
            http::async_read_header(self->stream_, self->buffer_, self->parser_,
                                    [self](beast::error_code e3, size_t) { self->on_header(e3); });
          });
        });
  }

  void on_header(beast::error_code ec) {
    if (finished_) return;
    if (ec) return fail("reading the response header", ec, timeouts_.read);
    progress_.header_seen = true;
    const auto& response = parser_.get();
    std::string content_type(response[http::field::content_type]);
    // An answer that is not an event stream is complete when its header comes (the instance
    // answers once generation ended): all of it within the read timeout, not only each piece,
    // or a peer sending a byte a second holds the call for hours.
    if (!content_type.starts_with("text/event-stream")) {
      body_deadline_ = std::chrono::steady_clock::now() + timeouts_.read;
    }
    if (callbacks_.on_header) {
      callbacks_.on_header(static_cast<int>(response.result_int()), content_type);
    }
    read_body();
  }

  void read_body() {
    if (finished_) return;
    if (parser_.is_done()) return finish(ok_status());
    if (body_deadline_) {
      stream_.expires_at(*body_deadline_);
    } else {
      stream_.expires_after(timeouts_.read);
    }
    http::async_read_some(stream_, buffer_, parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (self->finished_) return;
                            std::string& body = self->parser_.get().body();
                            if (!body.empty()) {
                              std::string piece = std::move(body);
                              body.clear();
                              if (self->callbacks_.on_data)
                                self->callbacks_.on_data(std::move(piece));
                            }
                            if (ec)
                              return self->fail("reading the response", ec, self->timeouts_.read);
                            self->read_body();
                          });
  }

  UpstreamClient::Impl& client_;
  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxUnparsedHttpBytes};
  http::request<http::string_body> request_;
  http::response_parser<http::string_body> parser_;
  const std::string endpoint_, method_, target_;
  const UpstreamTimeouts timeouts_;
  UpstreamCallbacks callbacks_;
  const std::string host_, port_;
  bool finished_ = false;
  UpstreamProgress progress_;
  std::optional<std::chrono::steady_clock::time_point> body_deadline_;  // on_header
};

}  // namespace

UpstreamClient::UpstreamClient() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->ioc.run(); });
}

UpstreamClient::~UpstreamClient() {
  cancel_all();
  impl_->work.reset();
  impl_->thread.join();
}

void UpstreamClient::cancel_all() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    auto live = impl->live;  // finish() erases from the map
    for (auto& [raw, weak] : live) {
      if (auto call = weak.lock()) {
        call->finish(Status(StatusCode::kCancelled, "the upstream client is shutting down"));
      }
    }
  });
}

Result<std::shared_ptr<UpstreamCall>> UpstreamClient::start(UpstreamRequest request,
                                                            UpstreamTimeouts timeouts,
                                                            UpstreamCallbacks callbacks) {
  const std::string& endpoint = request.endpoint;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
    return invalid_argument("endpoint '" + endpoint + "': expected HOST:PORT");
  }
  const http::verb verb = http::string_to_verb(request.method);
  if (verb == http::verb::unknown) return invalid_argument("HTTP method '" + request.method + "'");
  std::string host = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
  auto call = std::make_shared<Call>(*impl_, std::move(request), timeouts, std::move(callbacks),
                                     std::move(host), std::move(port), verb);
  asio::post(impl_->ioc, [call] { call->begin(); });
  return std::shared_ptr<UpstreamCall>(call);
}

}  // namespace peerserve
