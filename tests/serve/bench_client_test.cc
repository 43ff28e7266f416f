#include "serve/bench_client.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <set>
#include <string>
#include <thread>

namespace peerserve {
namespace {

TEST(BenchClientTest, PercentileMatchesNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97]
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_EQ(percentile({7}, 99), 7.0);
}

TEST(BenchClientTest, PromptsShareTheRequestedPrefix) {
  BenchOptions o;
  o.num_prompts = 20;
  o.input_len = 100;
  o.prefix_share = 0.9;
  auto prompts = make_bench_prompts(o);
  ASSERT_EQ(prompts.size(), 20u);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& p : prompts) {
    ASSERT_EQ(p.size(), 100u);
    EXPECT_TRUE(std::equal(p.begin(), p.begin() + 90, prompts[0].begin()));
    for (int32_t t : p) {
      EXPECT_GE(t, o.token_low);
      EXPECT_LT(t, o.token_high);
    }
    distinct.insert(std::vector<int32_t>(p.begin() + 90, p.end()));
  }
  EXPECT_EQ(distinct.size(), 20u);  // the unique tails differ
  // Same seed, same prompts; another seed, another prefix.
  EXPECT_EQ(make_bench_prompts(o), prompts);
  o.seed = 5;
  EXPECT_NE(make_bench_prompts(o)[0], prompts[0]);
}

TEST(BenchClientTest, PoissonArrivalsHaveTheRequestedRate) {
  BenchOptions o;
  o.num_prompts = 20000;
  o.request_rate = 50.0;
  auto t = make_arrival_times(o);
  ASSERT_EQ(t.size(), 20000u);
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  // Mean gap 1/50 s; the sample mean of 20000 exponential gaps is within ~3% at 4 sigma
  // (relative standard error 1/sqrt(20000) = 0.7%).
  const double mean_gap = t.back() / (t.size() - 1);
  EXPECT_NEAR(mean_gap, 0.02, 0.02 * 0.03);
  o.request_rate = std::numeric_limits<double>::infinity();
  for (double x : make_arrival_times(o)) ASSERT_EQ(x, 0.0);
}

TEST(BenchClientTest, OptionValidation) {
  BenchOptions o;
  EXPECT_TRUE(o.validate().ok());
  o.prefix_share = 1.5;
  EXPECT_FALSE(o.validate().ok());
  o = BenchOptions{};
  o.endpoint = "/v1/chat/completions";
  EXPECT_FALSE(o.validate().ok());
  o = BenchOptions{};
  o.token_low = 10;
  o.token_high = 10;
  EXPECT_FALSE(o.validate().ok());
}

TEST(BenchClientTest, UnreachableServerIsAnErrorNotACrash) {
  BenchOptions o;
  o.url = "http://127.0.0.1:1";  // nothing listens on port 1
  o.num_prompts = 1;
  auto r = run_bench(o);
  EXPECT_FALSE(r.ok());
}

// A loopback server that answers GET /v1/models with one model and every other request
// with `status` and a JSON body carrying a Content-Length; or, with `silent`, accepts and
// never answers.
class CannedServer {
 public:
  CannedServer(int status, std::string body, bool silent = false)
      : status_(status), body_(std::move(body)), silent_(silent) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~CannedServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    for (int c : held_) ::close(c);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      if (silent_) {
        held_.push_back(c);
        continue;
      }
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      const bool models = request.rfind("GET /v1/models", 0) == 0;
      const std::string body = models ? R"({"object":"list","data":[{"id":"m"}]})" : body_;
      const std::string head = models ? "200 OK" : std::to_string(status_) + " Error";
      const std::string reply =
          "HTTP/1.1 " + head +
          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nConnection: close\r\n\r\n" + body;
      EXPECT_EQ(::write(c, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
      ::close(c);
    }
  }
  int status_;
  std::string body_;
  bool silent_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> held_;
  std::thread thread_;
};

// The server's error reply reaches the report (it was "read: body limit exceeded": Boost
// 1.74 reads an empty body limit as smaller than any Content-Length).
TEST(BenchClientTest, TheServersErrorReplyIsReported) {
  CannedServer server(404,
                      R"({"error":{"message":"no model named wrong","code":"model_not_found"}})");
  BenchOptions o;
  o.url = server.url();
  o.num_prompts = 2;
  o.model = "wrong";
  auto r = run_bench(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failed, 2);
  ASSERT_FALSE(r->first_errors.empty());
  EXPECT_NE(r->first_errors[0].find("HTTP 404"), std::string::npos) << r->first_errors[0];
  EXPECT_NE(r->first_errors[0].find("model_not_found"), std::string::npos) << r->first_errors[0];
}

// A server that accepts and never answers /v1/models is an error within the timeout.
TEST(BenchClientTest, ASilentServerIsAnErrorNotAHang) {
  CannedServer server(200, "", /*silent=*/true);
  BenchOptions o;
  o.url = server.url();
  o.num_prompts = 1;
  o.request_timeout_seconds = 0.5;
  auto r = run_bench(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no answer"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace peerserve
