// The clients peerserve processes call each other with (serve/http_client.h for whole calls,
// serve/upstream_client.h for answers passed on as they arrive), against peers that answer,
// refuse, stay silent or break off: every call ends, with an error naming the peer and the
// stage, within its deadline — never a hang.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/http_client.h"
#include "serve/upstream_client.h"

namespace peerserve {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// A loopback listener; each accepted connection gets `behaviour` (run on its own thread,
// which closes the socket after it returns), with the peer itself for linger().
class FakePeer {
 public:
  using Behaviour = std::function<void(int fd, const FakePeer& peer)>;
  explicit FakePeer(Behaviour behaviour) : behaviour_(std::move(behaviour)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ::listen(fd_, 16);
    acceptor_ = std::thread([this] {
      while (true) {
        const int client = ::accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        connections_.emplace_back([this, client] {
          behaviour_(client, *this);
          ::close(client);
        });
      }
    });
  }
  ~FakePeer() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    for (auto& t : connections_) t.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  // Sleeps up to `limit`, waking early once the peer is being torn down.
  void linger(milliseconds limit) const {
    const auto end = steady_clock::now() + limit;
    while (steady_clock::now() < end && !stopping_) std::this_thread::sleep_for(milliseconds(10));
  }

 private:
  Behaviour behaviour_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;
};

// Reads the request header (and ignores the body) so the peer's reply follows a request.
void read_request(int fd) {
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    got.append(buf, static_cast<size_t>(n));
  }
}

void send_all(int fd, const std::string& data) {
  (void)::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
}

// Reads the request, then says nothing (until the peer is torn down).
void stay_silent(int fd, const FakePeer& peer) {
  read_request(fd);
  peer.linger(milliseconds(20000));
}

uint16_t closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);  // nothing listens there now
  return ntohs(addr.sin_port);
}

TEST(HttpCall, AnswersAndErrors) {
  FakePeer ok([](int fd, const FakePeer&) {
    read_request(fd);
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  });
  auto reply = http_call(ok.endpoint(), "GET", "/x", "", milliseconds(2000));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "hello");

  auto refused =
      http_call("127.0.0.1:" + std::to_string(closed_port()), "GET", "/x", "", milliseconds(2000));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("connect"), std::string::npos);

  FakePeer garbage([](int fd, const FakePeer&) {
    read_request(fd);
    send_all(fd, "NOT HTTP AT ALL\r\n\r\n");
  });
  auto bad = http_call(garbage.endpoint(), "GET", "/x", "", milliseconds(2000));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);

  FakePeer big([](int fd, const FakePeer&) {
    read_request(fd);
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'x'));
  });
  auto too_big = http_call(big.endpoint(), "GET", "/x", "", milliseconds(2000), 1000);
  ASSERT_FALSE(too_big.ok()) << too_big->status << " " << too_big->body.size();
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);

  EXPECT_FALSE(http_call("no-port", "GET", "/x", "", milliseconds(100)).ok());
}

// The defect this guards against: a blocking Beast read has no deadline, so a peer that
// accepts and then says nothing held the caller forever.
TEST(HttpCall, SilentPeerTimesOut) {
  FakePeer silent(stay_silent);
  const auto start = steady_clock::now();
  auto reply = http_call(silent.endpoint(), "POST", "/v1/completions", "{}", milliseconds(300));
  const auto waited = steady_clock::now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("no answer within 300 ms"), std::string::npos)
      << reply.status().message();
  EXPECT_LT(waited, std::chrono::seconds(10));  // a bound on hanging, not a speed claim
}

// Collects one upstream call's callbacks.
struct Recorder {
  std::mutex mutex;
  std::condition_variable done_cv;
  int status = 0;
  std::string type, data;
  std::vector<std::string> pieces;
  bool done = false, header_seen = false, sent = false, timed_out = false;
  Status result;

  UpstreamCallbacks callbacks() {
    UpstreamCallbacks c;
    c.on_header = [this](int s, const std::string& t) {
      std::lock_guard<std::mutex> lock(mutex);
      status = s;
      type = t;
    };
    c.on_data = [this](std::string d) {
      std::lock_guard<std::mutex> lock(mutex);
      data += d;
      pieces.push_back(std::move(d));
    };
    c.on_done = [this](const Status& s, const UpstreamProgress& progress) {
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_FALSE(done) << "on_done ran twice";
      done = true;
      header_seen = progress.header_seen;
      sent = progress.sent;
      timed_out = progress.timed_out;
      result = s;
      done_cv.notify_all();
    };
    return c;
  }
  bool wait(milliseconds limit) {
    std::unique_lock<std::mutex> lock(mutex);
    return done_cv.wait_for(lock, limit, [this] { return done; });
  }
};

UpstreamRequest post_to(const std::string& endpoint) {
  UpstreamRequest r;
  r.endpoint = endpoint;
  r.method = "POST";
  r.target = "/v1/completions";
  r.body = "{\"stream\":true}";
  r.headers = {{"Content-Type", "application/json"}};
  return r;
}

TEST(UpstreamClient, PassesAStreamOnAsItArrives) {
  std::atomic<bool> second_sent{false};
  FakePeer peer([&](int fd, const FakePeer& self) {
    read_request(fd);
    send_all(fd,
             "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
             "chunked\r\n\r\n9\r\ndata: a\n\n\r\n");
    self.linger(milliseconds(300));  // the first event must arrive before the second exists
    second_sent = true;
    send_all(fd, "9\r\ndata: b\n\n\r\n0\r\n\r\n");
  });
  UpstreamClient client;
  Recorder rec;
  std::atomic<bool> first_before_second{false};
  UpstreamCallbacks callbacks = rec.callbacks();
  auto on_data = callbacks.on_data;
  callbacks.on_data = [&, on_data](std::string d) {
    if (d.find("data: a") != std::string::npos && !second_sent) first_before_second = true;
    on_data(std::move(d));
  };
  auto call = client.start(post_to(peer.endpoint()), {}, std::move(callbacks));
  ASSERT_TRUE(call.ok());
  ASSERT_TRUE(rec.wait(milliseconds(10000)));
  EXPECT_TRUE(rec.result.ok()) << rec.result.message();
  EXPECT_EQ(rec.status, 200);
  EXPECT_EQ(rec.type, "text/event-stream");
  EXPECT_EQ(rec.data, "data: a\n\ndata: b\n\n");
  EXPECT_TRUE(first_before_second);
}

TEST(UpstreamClient, FailuresNameTheStage) {
  UpstreamClient client;
  {
    Recorder rec;
    auto call =
        client.start(post_to("127.0.0.1:" + std::to_string(closed_port())), {}, rec.callbacks());
    ASSERT_TRUE(call.ok());
    ASSERT_TRUE(rec.wait(milliseconds(10000)));
    EXPECT_EQ(rec.result.code(), StatusCode::kUnavailable);
    EXPECT_NE(rec.result.message().find("connect"), std::string::npos) << rec.result.message();
    EXPECT_FALSE(rec.header_seen);
    EXPECT_FALSE(rec.sent);  // nothing reached a peer: safe to send elsewhere
    EXPECT_FALSE(rec.timed_out);
  }
  {
    FakePeer silent(stay_silent);
    Recorder rec;
    UpstreamTimeouts timeouts;
    timeouts.read = milliseconds(300);
    auto call = client.start(post_to(silent.endpoint()), timeouts, rec.callbacks());
    ASSERT_TRUE(call.ok());
    ASSERT_TRUE(rec.wait(milliseconds(10000)));
    EXPECT_EQ(rec.result.code(), StatusCode::kUnavailable);
    EXPECT_NE(rec.result.message().find("no answer within 300 ms"), std::string::npos)
        << rec.result.message();
    EXPECT_TRUE(rec.sent);  // the peer has the request: it may still be working on it
    EXPECT_FALSE(rec.header_seen);
    EXPECT_TRUE(rec.timed_out);
  }
  {
    FakePeer cut([](int fd, const FakePeer&) {
      read_request(fd);
      send_all(fd,
               "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
               "chunked\r\n\r\n20\r\ndata: partial");
    });
    Recorder rec;
    auto call = client.start(post_to(cut.endpoint()), {}, rec.callbacks());
    ASSERT_TRUE(call.ok());
    ASSERT_TRUE(rec.wait(milliseconds(10000)));
    EXPECT_EQ(rec.result.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(rec.header_seen);
    EXPECT_EQ(rec.status, 200);
  }
  {
    Recorder rec;
    UpstreamRequest bad = post_to("nonsense");
    EXPECT_FALSE(client.start(bad, {}, rec.callbacks()).ok());
  }
}

TEST(UpstreamClient, CancelClosesTheConnection) {
  std::atomic<bool> peer_saw_close{false};
  FakePeer peer([&](int fd, const FakePeer&) {
    read_request(fd);
    send_all(fd,
             "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
             "chunked\r\n\r\n");
    char buf[16];
    // Blocks until the client closes (recv 0) — what a server sees when its client leaves.
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::recv(fd, buf, sizeof(buf), 0) == 0) peer_saw_close = true;
  });
  UpstreamClient client;
  Recorder rec;
  auto call = client.start(post_to(peer.endpoint()), {}, rec.callbacks());
  ASSERT_TRUE(call.ok());
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  while (steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(rec.mutex);
      if (rec.status == 200) break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  (*call)->cancel();
  ASSERT_TRUE(rec.wait(milliseconds(10000)));
  EXPECT_EQ(rec.result.code(), StatusCode::kCancelled);
  for (int i = 0; i < 1000 && !peer_saw_close; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_TRUE(peer_saw_close);
}

TEST(UpstreamClient, DestructionEndsCallsInFlight) {
  FakePeer silent(stay_silent);
  Recorder rec;
  {
    UpstreamClient client;
    auto call = client.start(post_to(silent.endpoint()), {}, rec.callbacks());
    ASSERT_TRUE(call.ok());
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(rec.done);
  EXPECT_EQ(rec.result.code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace peerserve
