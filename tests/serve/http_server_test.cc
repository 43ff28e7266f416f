// The HTTP front end on loopback with plain blocking client sockets: whole responses,
// keep-alive, chunked streams written from another thread, the body limit (413), malformed
// requests (400) and disconnect detection mid-stream.
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

namespace peerserve {
namespace {

// A blocking client connection with a 10 s receive timeout.
class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(); }
  bool connected() const { return connected_; }
  void send(const std::string& data) { (void)::send(fd_, data.data(), data.size(), MSG_NOSIGNAL); }
  // Reads until `marker` has been seen (or the peer closes / times out).
  std::string read_until(const std::string& marker) {
    while (received_.find(marker) == std::string::npos) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    std::string out = received_;
    const size_t end = received_.find(marker);
    if (end != std::string::npos) {
      out = received_.substr(0, end + marker.size());
      received_.erase(0, end + marker.size());
    } else {
      received_.clear();
    }
    return out;
  }
  // Reads a response with a Content-Length body.
  std::string read_response() {
    std::string head = read_until("\r\n\r\n");
    const size_t cl = head.find("Content-Length: ");
    if (cl == std::string::npos) return head;
    const size_t len = std::stoul(head.substr(cl + 16));
    while (received_.size() < len) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    std::string body = received_.substr(0, len);
    received_.erase(0, std::min(len, received_.size()));
    return head + body;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void half_close() { ::shutdown(fd_, SHUT_WR); }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void start(RequestHandler handler, uint64_t max_body = 1024) {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.max_body_bytes = max_body;
    auto server = HttpServer::create(options, std::move(handler));
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    // After the event loop (the only thread that adds answerers), before the server goes:
    // their exchanges post into its io_context and their sessions count in its counters.
    for (std::thread& t : answerers_) t.join();
    answerers_.clear();
    server_.reset();
  }
  uint16_t port() const { return server_->port(); }
  // Runs `answer` on a thread of its own, joined before the server is destroyed (a detached
  // one could answer into a freed server: a slow answer outlived its test). Handlers only.
  void answer_later(std::function<void()> answer) { answerers_.emplace_back(std::move(answer)); }

  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::vector<std::thread> answerers_;  // event-loop thread, then TearDown
};

TEST_F(HttpServerTest, WholeResponsesAndKeepAlive) {
  start([](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    ex->respond(200, "text/plain",
                req.method + " " + req.path() + " [" + req.body + "] " +
                    (req.header("x-test") ? *req.header("x-test") : ""));
  });
  Client c(port());
  ASSERT_TRUE(c.connected());
  c.send("POST /echo?q=1 HTTP/1.1\r\nHost: x\r\nX-Test: hi\r\nContent-Length: 3\r\n\r\nabc");
  std::string r1 = c.read_response();
  EXPECT_EQ(r1.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r1;
  EXPECT_NE(r1.find("POST /echo [abc] hi"), std::string::npos) << r1;
  // Same connection again.
  c.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r2 = c.read_response();
  EXPECT_NE(r2.find("GET /again []"), std::string::npos) << r2;
  EXPECT_GE(server_->counters().requests_total, 2);
}

TEST_F(HttpServerTest, BodyTooLargeGets413) {
  start([](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); },
        /*max_body=*/16);
  Client c(port());
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'a'));
  std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 413 ", 0), 0u) << r;
  EXPECT_NE(r.find("\"error\""), std::string::npos) << r;
  EXPECT_NE(r.find("request_too_large"), std::string::npos) << r;
}

TEST_F(HttpServerTest, ExpectContinueIsAnswered) {
  start([](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    ex->respond(200, "text/plain", "got " + req.body);
  });
  Client c(port());
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(c.read_until("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  c.send("hello");
  std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("got hello"), std::string::npos) << r;
}

TEST_F(HttpServerTest, MalformedRequestGets400) {
  start(
      [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); });
  Client c(port());
  c.send("THIS IS NOT HTTP\r\n\r\n");
  std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
}

TEST_F(HttpServerTest, ChunkedStreamFromAnotherThread) {
  start([this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->start_stream("text/event-stream");
    answer_later([ex] {
      for (int i = 0; i < 5; ++i) ex->write_chunk("data: " + std::to_string(i) + "\n\n");
      ex->write_chunk("");  // ignored: an empty chunk would end the body
      ex->end_stream();
    });
  });
  Client c(port());
  c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = c.read_until("0\r\n\r\n");
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("text/event-stream"), std::string::npos) << r;
  // The chunked body decoded by hand must be the five events in order.
  std::string body = r.substr(r.find("\r\n\r\n") + 4);
  std::string decoded;
  while (true) {
    const size_t eol = body.find("\r\n");
    ASSERT_NE(eol, std::string::npos);
    const size_t len = std::stoul(body.substr(0, eol), nullptr, 16);
    if (len == 0) break;
    decoded += body.substr(eol + 2, len);
    body.erase(0, eol + 2 + len + 2);
  }
  EXPECT_EQ(decoded, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamRunsTheCallback) {
  auto disconnected = std::make_shared<std::promise<void>>();
  auto exchange_slot = std::make_shared<std::shared_ptr<HttpExchange>>();
  start([disconnected, exchange_slot](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->start_stream("text/event-stream");
    ex->write_chunk("data: first\n\n");
    ex->on_disconnect([disconnected] { disconnected->set_value(); });
    *exchange_slot = ex;  // keep the exchange open, as a generating request would
  });
  {
    Client c(port());
    c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_NE(c.read_until("first\n\n").find("first"), std::string::npos);
  }  // client closes its socket here
  auto future = disconnected->get_future();
  EXPECT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // Writing after the disconnect is harmless.
  (*exchange_slot)->write_chunk("data: late\n\n");
  (*exchange_slot)->end_stream();
  exchange_slot->reset();
}

TEST_F(HttpServerTest, ManyConcurrentStreamsOnOneThread) {
  // 300 open streams, all answered from one background thread after all are connected.
  constexpr int kClients = 300;
  std::mutex mutex;
  std::vector<std::shared_ptr<HttpExchange>> open;
  start([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->start_stream("text/event-stream");
    std::lock_guard<std::mutex> lock(mutex);
    open.push_back(ex);
  });
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(clients.back()->connected());
    clients.back()->send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  for (int wait = 0; wait < 1000; ++wait) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (static_cast<int>(open.size()) == kClients) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(static_cast<int>(open.size()), kClients);
    for (auto& ex : open) {
      ex->write_chunk("data: x\n\n");
      ex->end_stream();
    }
    open.clear();
  }
  for (auto& c : clients) EXPECT_NE(c->read_until("0\r\n\r\n").find("data: x"), std::string::npos);
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// A handler that throws must cost one 500, not the server: the next request is served.
TEST_F(HttpServerTest, ExceptionsInHandlersBecome500) {
  start([](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    if (req.path() == "/throw") throw std::runtime_error("boom");
    if (req.path() == "/throw-int") throw 42;
    if (req.path() == "/throw-later") {
      ex->post([] { throw std::logic_error("boom later"); });
      return;
    }
    if (req.path() == "/throw-mid-stream") {
      ex->start_stream("text/event-stream");
      ex->write_chunk("data: 1\n\n");
      ex->post([] { throw std::runtime_error("boom mid-stream"); });
      return;
    }
    ex->respond(200, "text/plain", "fine");
  });
  for (const char* path : {"/throw", "/throw-int", "/throw-later"}) {
    Client c(port());
    ASSERT_TRUE(c.connected());
    c.send(std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string r = c.read_response();
    EXPECT_EQ(r.rfind("HTTP/1.1 500 ", 0), 0u) << path << ": " << r;
    EXPECT_NE(r.find("internal_error"), std::string::npos) << r;
    EXPECT_EQ(r.find("boom"), std::string::npos) << "exception text must not leak: " << r;
  }
  {
    Client c(port());
    c.send("GET /throw-mid-stream HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string r = c.read_until("0\r\n\r\n");
    EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u) << r;
    EXPECT_NE(r.find("data: 1"), std::string::npos) << r;
    EXPECT_NE(r.find("0\r\n\r\n"), std::string::npos) << "the stream must end properly: " << r;
  }
  Client c(port());
  c.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u) << r;
  EXPECT_NE(r.find("fine"), std::string::npos) << r;
  EXPECT_EQ(server_->counters().responses_by_status.at(500), 3);
}

TEST_F(HttpServerTest, HeadAnswersHeadersWithoutBody) {
  start([](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    ex->respond(200, "application/json", "{\"method\":\"" + req.method + "\"}");
  });
  Client c(port());
  c.send("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string head = c.read_until("\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 17\r\n"), std::string::npos) << head;
  // Keep-alive: the next answer follows at once, so no body was sent after the HEAD one.
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string get = c.read_response();
  EXPECT_EQ(get.rfind("HTTP/1.1 200 ", 0), 0u) << get;
  EXPECT_NE(get.find("{\"method\":\"GET\"}"), std::string::npos) << get;
}

TEST_F(HttpServerTest, CompressedBodiesGet415) {
  std::atomic<int> handled{0};
  start([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ++handled;
    ex->respond(200, "text/plain", "ok");
  });
  Client c(port());
  c.send(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
      "Content-Length: 4\r\n\r\n\x1f\x8b\x08\x01");
  const std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 415 ", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Encoding 'gzip' is not supported"), std::string::npos) << r;
  EXPECT_EQ(handled.load(), 0);
  // identity is no encoding; the connection is still usable.
  c.send(
      "POST /x HTTP/1.1\r\nHost: x\r\nContent-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}");
  const std::string ok = c.read_response();
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 ", 0), 0u) << ok;
  EXPECT_EQ(handled.load(), 1);
}

// A chunk-size line that never ends: Beast's header limit does not cover it, and the read
// buffer grew for as long as the body deadline lasted (60 s, at any bandwidth). The buffer
// is bounded now: the request gets a 400.
TEST_F(HttpServerTest, AChunkSizeLineWithoutEndIsRefusedNotBuffered) {
  start(
      [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); });
  Client c(port());
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string digits(32 * 1024, '1');
  for (int i = 0; i < 16; ++i) c.send(digits);  // 512 KiB of one chunk size
  const std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r.substr(0, 200);
}

// After an early error answer the rest of the request is drained for at most 5 s in all: a
// client trickling a byte a second renewed that deadline with every read and kept its
// connection (and slot) forever.
TEST_F(HttpServerTest, TheDrainAfterAnErrorEndsWhateverTheClientSends) {
  start(
      [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); });
  Client c(port());
  c.send("NOT HTTP\r\n\r\n");
  const std::string r = c.read_response();
  ASSERT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
  for (int i = 0; i < 7; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    c.send("x");
  }
  EXPECT_EQ(server_->counters().connections_open, 0);
}

// A Transfer-Encoding that does not end in chunked: Beast took the body as empty and its
// bytes as the next request (request smuggling). RFC 9112 §6.3: 400 and close.
TEST_F(HttpServerTest, ATransferEncodingOtherThanChunkedIsRefused) {
  std::atomic<int> handled{0};
  start([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ++handled;
    ex->respond(200, "text/plain", "ok");
  });
  for (const char* coding : {"gzip", "chunked, x", "xchunked"}) {
    SCOPED_TRACE(coding);
    Client c(port());
    c.send(std::string("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + coding +
           "\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string r = c.read_response();
    EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
    EXPECT_EQ(c.read_response(), "") << "a second answer: the body was taken as a request";
  }
  EXPECT_EQ(handled.load(), 0);
}

// A coding before chunked (one list or two fields): the body would reach the handler still
// gzip-coded. 501 (RFC 9112 6.1), and nothing after it is read as a request.
TEST_F(HttpServerTest, ACodingBeforeChunkedGets501) {
  std::atomic<int> handled{0};
  start([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ++handled;
    ex->respond(200, "text/plain", "ok");
  });
  for (const char* fields : {"Transfer-Encoding: gzip, chunked\r\n",
                             "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"}) {
    SCOPED_TRACE(fields);
    Client c(port());
    c.send(std::string("POST /x HTTP/1.1\r\nHost: x\r\n") + fields +
           "\r\n3\r\nabc\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string r = c.read_response();
    EXPECT_EQ(r.rfind("HTTP/1.1 501 ", 0), 0u) << r;
    EXPECT_NE(r.find("Transfer-Encoding 'gzip' is not supported"), std::string::npos) << r;
    EXPECT_EQ(c.read_response(), "") << "answered past the refusal";
  }
  // Plain chunked is fine, in any case.
  Client c(port());
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_EQ(c.read_response().rfind("HTTP/1.1 200 ", 0), 0u);
  EXPECT_EQ(handled.load(), 1);
}

// RFC 9112 3.2: an HTTP/1.1 request without Host is a 400; HTTP/1.0 needs none.
TEST_F(HttpServerTest, AnHttp11RequestWithoutHostGets400) {
  start(
      [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); });
  {
    Client c(port());
    c.send("GET /health HTTP/1.1\r\n\r\n");
    const std::string r = c.read_response();
    EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
    EXPECT_NE(r.find("needs a Host header"), std::string::npos) << r;
  }
  {  // after a HEAD on the same connection, the refusal still carries its body
    Client c(port());
    c.send("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(c.read_until("\r\n\r\n").rfind("HTTP/1.1 200 ", 0), 0u);
    c.send("GET /health HTTP/1.1\r\n\r\n");
    const std::string r = c.read_until("the connection's end");  // it closes after
    EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
    EXPECT_NE(r.find("needs a Host header"), std::string::npos) << r;
  }
  Client c(port());
  c.send("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_NE(c.read_until("the connection's end").find(" 200 "), std::string::npos);
}

// The unsent-output limit catches a client that stopped reading a stream; one whole
// response larger than it goes out (it was dropped unsent, the client got nothing).
TEST_F(HttpServerTest, AWholeResponseLargerThanTheUnsentLimitIsSent) {
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.max_unsent_bytes = 4096;
  const std::string big(64 * 1024, 'z');
  auto server = HttpServer::create(options, [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->respond(200, "text/plain", big);
  });
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  server_ = std::move(server).value();
  thread_ = std::thread([this] { server_->run(); });
  Client c(port());
  c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = c.read_response();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u) << r.substr(0, 200);
  EXPECT_EQ(r.size() - r.find("\r\n\r\n") - 4, big.size());
}

// Over the connection cap a request other than a probe is refused at its header: it got
// "100 Continue" and had its whole body read first (up to max_body_bytes per socket).
TEST_F(HttpServerTest, OverTheConnectionCapARequestIsRefusedBeforeItsBody) {
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.max_connections = 1;
  auto server = HttpServer::create(options, [](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->respond(200, "text/plain", "ok");
  });
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  server_ = std::move(server).value();
  thread_ = std::thread([this] { server_->run(); });
  Client first(port());  // holds the one slot
  ASSERT_TRUE(first.connected());
  for (int i = 0; i < 100 && server_->counters().connections_open < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Client second(port());
  second.send(
      "POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n");
  const std::string r = second.read_until("\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 503 ", 0), 0u) << r;
  // A probe still gets its answer.
  Client probe(port());
  probe.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(probe.read_response().rfind("HTTP/1.1 200 ", 0), 0u);
}

// Requests pipelined in one send are answered in order. Then a client that closes its side
// before its answer is complete is gone, streaming or not, as in vLLM: the handler hears of it
// (the engine aborts the request) instead of computing an answer nobody reads. (Such a close
// was taken for an HTTP half-close, and a non-streamed request ran to max_tokens.)
TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredAndACloseBeforeTheAnswerIsAnAbort) {
  std::atomic<int> disconnects{0};
  start([&](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    if (req.path() == "/slow") {
      ex->on_disconnect([&] { ++disconnects; });
      answer_later([ex] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ex->respond(200, "text/plain", "slow");
      });
      return;
    }
    ex->respond(200, "text/plain", "fast");
  });
  {
    Client c(port());
    c.send("GET /fast HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_NE(c.read_response().find("fast"), std::string::npos);
    EXPECT_NE(c.read_response().find("fast"), std::string::npos);
  }
  Client c(port());
  c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  c.half_close();
  for (int i = 0; i < 200 && disconnects.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(disconnects.load(), 1) << "the non-streamed request's client left unnoticed";
}

// An HTTP/1.0 client cannot read the chunked coding: its stream comes unchunked and ends
// when the connection closes (it got hex size lines in its data).
TEST_F(HttpServerTest, AnHttp10StreamIsSentUnchunkedAndEndsWithTheConnection) {
  start([this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->start_stream("text/event-stream");
    answer_later([ex] {
      for (int i = 0; i < 3; ++i) ex->write_chunk("data: " + std::to_string(i) + "\n\n");
      ex->end_stream();
    });
  });
  Client c(port());
  c.send("GET /stream HTTP/1.0\r\n\r\n");
  const std::string r = c.read_until("the connection's end");  // reads until EOF
  EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r;
  EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

}  // namespace
}  // namespace peerserve
