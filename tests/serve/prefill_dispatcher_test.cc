// The decode instance's choice of prefill instance: a busy instance (429) is passed over for
// the next one, a refused prompt (other 4xx) is not retried elsewhere.
#include "serve/prefill_dispatcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/http_server.h"

namespace peerserve {
namespace {

constexpr const char* kIdentity = "peerserve-kv/1;test;";

// A fake prefill instance: its card names kIdentity; completions answer `status`. With a
// `key`, every route wants it as a bearer token (401 otherwise), as serve --api-key does.
class FakePrefill {
 public:
  explicit FakePrefill(int status, std::string key = {}) : status_(status), key_(std::move(key)) {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = HttpServer::create(options, [this](HttpRequest req,
                                                     std::shared_ptr<HttpExchange> ex) {
      const std::string* auth = req.header("authorization");
      if (!key_.empty() && (auth == nullptr || *auth != "Bearer " + key_)) {
        ex->respond(401, "application/json", R"({"error":"key"})");
        return;
      }
      const std::string identity = this->identity();
      if (req.path() == "/v1/models") {
        ex->respond(200, "application/json",
                    R"({"data":[{"id":"m","peerserve":{"kv_namespace":")" + identity + R"("}}]})");
        return;
      }
      ++completions_;
      // As serve does: a request expecting another KV namespace is refused with 409.
      const auto body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_object() && body.value("peerserve_kv_namespace", "") != identity) {
        ex->respond(409, "application/json", R"({"error":"kv_namespace_mismatch"})");
        return;
      }
      ex->respond(status_, "application/json",
                  status_ == 200 ? R"({"choices":[{"text":"x"}]})" : R"({"error":"no"})");
    });
    PS_CHECK(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~FakePrefill() {
    server_->stop();
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  int completions() const { return completions_.load(); }
  // As if restarted with another KV namespace (block size, model, ...).
  void set_identity(std::string identity) {
    std::lock_guard<std::mutex> lock(mutex_);
    identity_ = std::move(identity);
  }
  std::string identity() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return identity_;
  }

 private:
  mutable std::mutex mutex_;
  std::string identity_ = kIdentity;
  const int status_;
  const std::string key_;
  std::atomic<int> completions_{0};
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST(PrefillDispatcherTest, ABusyInstanceIsPassedOverForTheNext) {
  FakePrefill busy(429), idle(200);
  auto dispatcher = PrefillDispatcher::create(busy.endpoint() + "," + idle.endpoint(), kIdentity,
                                              std::chrono::milliseconds(5000));
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status().to_string();
  (*dispatcher)->set_preferred(0);
  const std::vector<TokenId> prompt = {1, 2, 3};
  const Status s = (*dispatcher)->prefill(prompt);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(busy.completions(), 1);
  EXPECT_EQ(idle.completions(), 1);
  EXPECT_EQ((*dispatcher)->counters().retries, 1);
}

TEST(PrefillDispatcherTest, ARefusedPromptIsNotTriedElsewhere) {
  FakePrefill refusing(400), idle(200);
  auto dispatcher = PrefillDispatcher::create(refusing.endpoint() + "," + idle.endpoint(),
                                              kIdentity, std::chrono::milliseconds(5000));
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status().to_string();
  (*dispatcher)->set_preferred(0);
  const std::vector<TokenId> prompt = {1, 2, 3};
  const Status s = (*dispatcher)->prefill(prompt);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("refused the prompt (400)"), std::string::npos) << s.message();
  EXPECT_EQ(idle.completions(), 0);
}

// An instance restarted with another KV namespace refuses the calls that name the expected
// one (409); the dispatcher reads its card again, leaves it out and goes to the next one
// (it kept answering 200 and its pushed blocks were refused, so every prompt was computed
// twice).
TEST(PrefillDispatcherTest, AnInstanceRestartedWithOtherKvIsLeftOut) {
  FakePrefill first(200), second(200);
  auto dispatcher = PrefillDispatcher::create(first.endpoint() + "," + second.endpoint(), kIdentity,
                                              std::chrono::milliseconds(5000));
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status().to_string();
  (*dispatcher)->set_preferred(0);
  const std::vector<TokenId> prompt = {1, 2, 3};
  ASSERT_TRUE((*dispatcher)->prefill(prompt).ok());
  EXPECT_EQ(first.completions(), 1);
  first.set_identity("peerserve-kv/1;test;block 32");
  const Status s = (*dispatcher)->prefill(prompt);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(first.completions(), 2);
  EXPECT_EQ(second.completions(), 1);
  // Left out from then on.
  ASSERT_TRUE((*dispatcher)->prefill(prompt).ok());
  EXPECT_EQ(first.completions(), 2);
  EXPECT_EQ(second.completions(), 2);
}

TEST(PrefillDispatcherTest, TheDeploymentsApiKeyIsSentAndAWrongOneIsNamed) {
  FakePrefill locked(200, "sesame");
  const std::vector<TokenId> prompt = {1, 2, 3};
  auto with_key = PrefillDispatcher::create(locked.endpoint(), kIdentity,
                                            std::chrono::milliseconds(5000), "sesame");
  ASSERT_TRUE(with_key.ok());
  std::vector<std::string> unreachable;
  EXPECT_TRUE((*with_key)->check(&unreachable).ok());
  EXPECT_TRUE(unreachable.empty());
  EXPECT_TRUE((*with_key)->prefill(prompt).ok());
  EXPECT_EQ(locked.completions(), 1);

  auto without =
      PrefillDispatcher::create(locked.endpoint(), kIdentity, std::chrono::milliseconds(5000));
  ASSERT_TRUE(without.ok());
  const Status s = (*without)->check(&unreachable);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("--api-key"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace peerserve
