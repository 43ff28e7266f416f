// End-to-end: the real `peerserve serve` process on loopback (port 0) with the tiny test
// model. The official OpenAI Node SDK drives chat / streamed chat / completions; raw HTTP
// covers the bad-input matrix, client disconnects and queue limits.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "model/checkpoint/test_model.h"
#include "model/checkpoint/test_tokenizer.h"
#include "tests/serve/server_process.h"

namespace peerserve {
namespace {

using json = nlohmann::json;
using testing::http_request;
using testing::HttpResponse;
using testing::metric_sum;
using testing::metric_value;
using testing::ServerProcess;

constexpr const char* kKey = "test-key";
constexpr int kMaxNumSeqs = 4;

std::string auth() {
  return std::string("Authorization: Bearer ") + kKey;
}

class ServerIntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = std::make_unique<std::filesystem::path>(
        std::filesystem::temp_directory_path() / ("peerserve_tiny_" + std::to_string(::getpid())));
    TestModelOptions options;
    options.preset = TestModelPreset::kTiny;
    options.seed = 1;
    Status s = write_test_model(model_dir_->string(), options);
    ASSERT_TRUE(s.ok()) << s.to_string();
    server_ = std::make_unique<ServerProcess>();
    ASSERT_TRUE(server_->start(
        model_dir_->string(),
        {"--served-model-name", "tiny", "--api-key", kKey, "--max-num-seqs",
         std::to_string(kMaxNumSeqs), "--max-num-batched-tokens", "64", "--max-model-len", "512",
         "--kv-cache-memory", "4MiB", "--max-body-bytes", "65536"}))
        << server_->read_log();
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(), 0) << server_->read_log();
    }
    server_.reset();
    std::error_code ec;
    std::filesystem::remove_all(*model_dir_, ec);
    model_dir_.reset();
  }

  static uint16_t port() { return server_->port(); }
  static std::string metrics() { return http_request(port(), "GET", "/metrics").body; }
  // Waits (bounded) until no sequence runs or waits and no KV block is used.
  static bool wait_idle() {
    for (int i = 0; i < 400; ++i) {
      const std::string m = metrics();
      if (metric_value(m, "peerserve:kv_cache_blocks_used") == 0.0 &&
          metric_value(m, "peerserve:num_requests_running") == 0.0 &&
          metric_value(m, "peerserve:num_requests_waiting") == 0.0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  static std::unique_ptr<std::filesystem::path> model_dir_;
  static std::unique_ptr<ServerProcess> server_;
};

std::unique_ptr<std::filesystem::path> ServerIntegrationTest::model_dir_;
std::unique_ptr<ServerProcess> ServerIntegrationTest::server_;

TEST_F(ServerIntegrationTest, HealthModelsAndMetrics) {
  EXPECT_EQ(http_request(port(), "GET", "/health").status, 200);
  HttpResponse version = http_request(port(), "GET", "/version");  // as vLLM's
  ASSERT_EQ(version.status, 200) << version.body;
  EXPECT_EQ(json::parse(version.body)["version"], PEERSERVE_VERSION);
  HttpResponse models = http_request(port(), "GET", "/v1/models", "", {auth()});
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "tiny");
  HttpResponse m = http_request(port(), "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers.find("text/plain"), std::string::npos);
  for (const char* family :
       {"peerserve:time_to_first_token_seconds_bucket", "peerserve:inter_token_latency_seconds_sum",
        "peerserve:e2e_request_latency_seconds_count", "peerserve:num_requests_running",
        "peerserve:num_requests_waiting", "peerserve:kv_cache_blocks_used",
        "peerserve:kv_cache_blocks_free", "peerserve:prefix_cache_hit_rate",
        "peerserve:prompt_tokens_total", "peerserve:generation_tokens_total",
        "peerserve:num_preemptions_total"}) {
    EXPECT_NE(m.body.find(family), std::string::npos) << family;
  }
}

TEST_F(ServerIntegrationTest, OpenAiNodeSdk) {
  const std::string js = testing::source_dir() + "/tests/js";
  if (!std::filesystem::exists(js + "/node_modules/openai")) {
    GTEST_SKIP() << "tests/js/node_modules/openai is missing: run scripts/install-test-js.sh";
  }
  const std::string cmd = "node " + js +
                          "/openai_sdk_check.mjs http://127.0.0.1:" + std::to_string(port()) +
                          " tiny " + kKey + " " + std::to_string(kMaxNumSeqs) + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("ALL OK"), std::string::npos) << output;
  EXPECT_TRUE(wait_idle());
}

// The bad-input matrix: every case gets the right status and an OpenAI-shaped error, and
// the server keeps serving afterwards.
TEST_F(ServerIntegrationTest, BadInputMatrix) {
  struct Case {
    std::string method, path, body;
    std::vector<std::string> headers;
    int status;
    std::string code;          // expected error.code ("" = not checked)
    std::string param = "";    // expected error.param ("" = not checked)
    std::string message = "";  // a part of error.message ("" = not checked)
  };
  const std::string ok_prompt = R"("prompt": "hi", "max_tokens": 2)";
  std::string long_prompt = R"({"model": "tiny", "max_tokens": 4, "prompt": [)";
  for (int i = 0; i < 600; ++i) long_prompt += (i ? ",5" : "5");
  long_prompt += "]}";
  // Exactly the context (512 tokens), scored only: no room for a token, and none asked for.
  std::string full_prompt = R"({"model": "tiny", "max_tokens": 0, "echo": true, "prompt": [)";
  for (int i = 0; i < 512; ++i) full_prompt += (i ? ",5" : "5");
  full_prompt += "]}";
  const std::vector<Case> cases = {
      {"POST", "/v1/completions", "{not json", {auth()}, 400, "invalid_json"},
      {"POST", "/v1/completions", "[1, 2]", {auth()}, 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"model": "tiny"})", {auth()}, 400, "invalid_value"},
      {"POST",
       "/v1/completions",
       R"({"model": "tiny", "prompt": "x", "temperature": -1})",
       {auth()},
       400,
       "invalid_value"},
      {"POST",
       "/v1/completions",
       R"({"model": "tiny", "prompt": "x", "n": 100})",
       {auth()},
       400,
       "invalid_value"},
      {"POST", "/v1/completions", R"({"model": "tiny", "prompt": [999999]})", {auth()}, 400, ""},
      {"POST", "/v1/completions", long_prompt, {auth()}, 400, "context_length_exceeded", "prompt"},
      {"POST",
       "/v1/completions",
       full_prompt,
       {auth()},
       400,
       "context_length_exceeded",
       "prompt",
       "the prompt has 512"},
      // The prompt fits; max_tokens is what to change (vLLM names it too).
      {"POST",
       "/v1/completions",
       R"({"model": "tiny", "prompt": "x", "max_tokens": 100000})",
       {auth()},
       400,
       "context_length_exceeded",
       "max_tokens"},
      // Above the default max_tokens (16), which the client did not send.
      {"POST",
       "/v1/completions",
       R"({"model": "tiny", "prompt": "x", "min_tokens": 20})",
       {auth()},
       400,
       "invalid_value",
       "min_tokens"},
      {"POST",
       "/v1/chat/completions",
       R"({"model": "tiny", "messages": []})",
       {auth()},
       400,
       "invalid_value"},
      {"POST",
       "/v1/chat/completions",
       R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream_options": {}})",
       {auth()},
       400,
       "invalid_value"},
      {"POST",
       "/v1/completions",
       "{\"model\": \"nope\", " + ok_prompt + "}",
       {auth()},
       404,
       "model_not_found"},
      {"POST",
       "/v1/completions",
       "{\"model\": \"tiny\", " + ok_prompt + "}",
       {},
       401,
       "invalid_api_key"},
      {"POST",
       "/v1/completions",
       "{\"model\": \"tiny\", " + ok_prompt + "}",
       {"Authorization: Bearer wrong"},
       401,
       "invalid_api_key"},
      {"GET", "/v1/nothing-here", "", {auth()}, 404, "not_found"},
      {"GET", "/v1/completions", "", {auth()}, 405, "method_not_allowed"},
      {"POST", "/v1/completions", std::string(70000, ' '), {auth()}, 413, "request_too_large"},
      {"POST", "/detokenize", R"({"tokens": [-5]})", {}, 400, ""},
      // Wrapped to token 1 when read as 32 bits.
      {"POST", "/detokenize", R"({"tokens": [4294967297]})", {}, 400, ""},
      {"POST", "/detokenize", R"({"tokens": [18446744073709551615]})", {}, 400, ""},
      {"POST", "/tokenize", R"({"nothing": 1})", {}, 400, ""},
      // A decode instance expecting KV of a namespace this server does not compute.
      {"POST",
       "/v1/completions",
       "{\"model\": \"tiny\", \"peerserve_kv_namespace\": \"peerserve-kv/1;x\", " + ok_prompt + "}",
       {auth()},
       409,
       "kv_namespace_mismatch"},
  };
  for (const Case& c : cases) {
    HttpResponse r = http_request(port(), c.method, c.path, c.body, c.headers);
    ASSERT_TRUE(r.ok) << c.method << " " << c.path << " " << c.body.substr(0, 80);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 80) << " -> " << r.body;
    json body = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << r.body;
    ASSERT_TRUE(body.contains("error")) << r.body;
    for (const char* key : {"message", "type", "param", "code"}) {
      EXPECT_TRUE(body["error"].contains(key)) << key << " in " << r.body;
    }
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
    if (!c.code.empty()) {
      EXPECT_EQ(body["error"]["code"], c.code) << r.body;
    }
    if (!c.param.empty()) {
      EXPECT_EQ(body["error"]["param"], c.param) << r.body;
    }
    if (!c.message.empty()) {
      EXPECT_NE(body["error"]["message"].get<std::string>().find(c.message), std::string::npos)
          << r.body;
    }
  }
  // Still serving.
  HttpResponse r = http_request(port(), "POST", "/v1/completions",
                                "{\"model\": \"tiny\", " + ok_prompt + "}", {auth()});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>() <= 2, true);
  EXPECT_TRUE(wait_idle());
}

TEST_F(ServerIntegrationTest, TokenizeRoundTrip) {
  HttpResponse t = http_request(port(), "POST", "/tokenize", R"({"prompt": "hello world"})");
  ASSERT_EQ(t.status, 200) << t.body;
  json tj = json::parse(t.body);
  EXPECT_EQ(tj["count"], tj["tokens"].size());
  EXPECT_EQ(tj["max_model_len"], 512);
  json detok = {{"tokens", tj["tokens"]}};
  HttpResponse d = http_request(port(), "POST", "/detokenize", detok.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  // add_bos_token: the text comes back behind the BOS token's text.
  const std::string text = json::parse(d.body)["prompt"];
  EXPECT_EQ(text.substr(text.size() - 11), "hello world");
}

// A client that disconnects mid-stream aborts its request: the KV blocks go back to idle.
TEST_F(ServerIntegrationTest, DisconnectMidStreamFreesKvBlocks) {
  ASSERT_TRUE(wait_idle());
  const double aborts_before =
      metric_sum(metrics(), "peerserve:request_success_total", "finished_reason=\"abort\"");
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body =
      // n = 4: enough work that the request is still generating when the client leaves.
      R"({"model": "tiny", "prompt": "a long story", "max_tokens": 400, "n": 4, "ignore_eos": true, "stream": true})";
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth() +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("\"text\"") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  // The request is generating now: blocks are in use.
  EXPECT_GT(metric_value(metrics(), "peerserve:kv_cache_blocks_used").value_or(0), 0.0);
  ::close(fd);
  EXPECT_TRUE(wait_idle()) << metrics();
  EXPECT_EQ(metric_sum(metrics(), "peerserve:request_success_total", "finished_reason=\"abort\""),
            aborts_before + 1);
}

TEST_F(ServerIntegrationTest, MoreConcurrentRequestsThanMaxNumSeqs) {
  constexpr int kRequests = kMaxNumSeqs * 4;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      json body = {{"model", "tiny"},
                   {"prompt", "concurrent " + std::to_string(i)},
                   {"max_tokens", 10},
                   {"ignore_eos", true},
                   {"temperature", 0}};
      HttpResponse r = http_request(port(), "POST", "/v1/completions", body.dump(), {auth()});
      if (r.status == 200 && json::parse(r.body)["usage"]["completion_tokens"] == 10) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kRequests);
  EXPECT_TRUE(wait_idle());
}

// Hostile and careless input on the real server: each gets a clear 4xx and the server
// keeps serving.
TEST_F(ServerIntegrationTest, HostileInputsGetClearErrors) {
  // Nested 30,000 deep (60 KB, under this server's body limit; the unit test checks 300,000).
  const std::string deep = R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                               "tools": )" +
                           std::string(30000, '[') + std::string(30000, ']') + "}";
  HttpResponse r = http_request(port(), "POST", "/v1/chat/completions", deep, {auth()});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("nested deeper than 64"), std::string::npos) << r.body;
  // A lone surrogate is valid JSON: accepted.
  r = http_request(port(), "POST", "/v1/chat/completions",
                   R"({"model": "tiny", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "a\ud800b"}]})",
                   {auth()});
  EXPECT_EQ(r.status, 200) << r.body;
  // 2^63 is printed as sent.
  r = http_request(port(), "POST", "/v1/completions",
                   R"({"model": "tiny", "prompt": "x", "max_tokens": 9223372036854775808})",
                   {auth()});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("got 9223372036854775808"), std::string::npos) << r.body;
  // 401 says how to authenticate.
  r = http_request(port(), "GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.headers.find("WWW-Authenticate: Bearer"), std::string::npos) << r.headers;
  // Compressed bodies are refused by name.
  r = http_request(port(), "POST", "/v1/completions", R"({"prompt": "x"})",
                   {auth(), "Content-Encoding: gzip"});
  EXPECT_EQ(r.status, 415) << r.body;
  EXPECT_NE(r.body.find("Content-Encoding 'gzip'"), std::string::npos) << r.body;
  // HEAD on GET routes: the headers, no body.
  for (const char* path : {"/health", "/v1/models", "/metrics"}) {
    r = http_request(port(), "HEAD", path, "", {auth()});
    EXPECT_EQ(r.status, 200) << path << " " << r.headers;
    EXPECT_TRUE(r.body.empty()) << path << " " << r.body.substr(0, 100);
  }
  r = http_request(port(), "HEAD", "/v1/completions", "", {auth()});
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(http_request(port(), "GET", "/health").status, 200);
}

// Every field either works or is refused with a 400 naming it.
// A completion without max_tokens gets 16 tokens, or what is left of the context (512 here)
// when less: a prompt 4 tokens short of it is answered, not refused as too long.
TEST_F(ServerIntegrationTest, CompletionsDefaultToSixteenTokensWithinTheContext) {
  json short_prompt = {{"model", "tiny"}, {"prompt", json::array({5, 6, 7})}, {"ignore_eos", true}};
  HttpResponse r = http_request(port(), "POST", "/v1/completions", short_prompt.dump(), {auth()});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 16) << r.body;
  json ids = json::array();
  for (int i = 0; i < 508; ++i) ids.push_back(5);
  json near_end = {{"model", "tiny"}, {"prompt", ids}, {"ignore_eos", true}};
  r = http_request(port(), "POST", "/v1/completions", near_end.dump(), {auth()});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 4) << r.body;
  EXPECT_TRUE(wait_idle());
}

// vLLM's truncate_prompt_tokens keeps a prompt's last k tokens (a prompt over the context
// then runs), add_special_tokens false leaves BOS off a text prompt, and
// continue_final_message continues the last message.
TEST_F(ServerIntegrationTest, VllmPromptOptions) {
  const auto complete = [&](const json& body) {
    HttpResponse r = http_request(port(), "POST", "/v1/completions", body.dump(), {auth()});
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  };
  json ids = json::array();
  for (int i = 0; i < 600; ++i) ids.push_back(5 + i % 97);  // more than the 512 of the context
  json body = {{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 4}, {"temperature", 0}};
  HttpResponse too_long = http_request(port(), "POST", "/v1/completions", body.dump(), {auth()});
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  body["truncate_prompt_tokens"] = 500;
  const json truncated = complete(body);
  EXPECT_EQ(truncated["usage"]["prompt_tokens"], 500) << truncated.dump();
  json last = json::array();
  for (int i = 100; i < 600; ++i) last.push_back(ids[i]);
  const json direct =
      complete({{"model", "tiny"}, {"prompt", last}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(truncated["choices"][0]["text"], direct["choices"][0]["text"]);

  const json with_bos = complete({{"model", "tiny"}, {"prompt", "hello there"}, {"max_tokens", 1}});
  const json without = complete({{"model", "tiny"},
                                 {"prompt", "hello there"},
                                 {"max_tokens", 1},
                                 {"add_special_tokens", false}});
  EXPECT_EQ(without["usage"]["prompt_tokens"].get<int>() + 1,
            with_bos["usage"]["prompt_tokens"].get<int>())
      << with_bos.dump() << without.dump();

  // continue_final_message: the chat answer continues the assistant's message, as the
  // completion of the same tokens (from /tokenize, which takes the flag too) does.
  const json messages = json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}])");
  json chat = {{"model", "tiny"},
               {"messages", messages},
               {"continue_final_message", true},
               {"add_generation_prompt", false},
               {"max_tokens", 4},
               {"temperature", 0}};
  HttpResponse answer = http_request(port(), "POST", "/v1/chat/completions", chat.dump(), {auth()});
  ASSERT_EQ(answer.status, 200) << answer.body;
  HttpResponse tokens = http_request(port(), "POST", "/tokenize",
                                     json{{"model", "tiny"},
                                          {"messages", messages},
                                          {"continue_final_message", true},
                                          {"add_generation_prompt", false}}
                                         .dump(),
                                     {auth()});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  const json same = complete({{"model", "tiny"},
                              {"prompt", json::parse(tokens.body)["tokens"]},
                              {"max_tokens", 4},
                              {"temperature", 0}});
  EXPECT_EQ(json::parse(answer.body)["choices"][0]["message"]["content"],
            same["choices"][0]["text"])
      << answer.body << same.dump();
  // return_token_ids: the prompt's ids (what /tokenize gives) and the choice's.
  chat["return_token_ids"] = true;
  const json with_ids =
      json::parse(http_request(port(), "POST", "/v1/chat/completions", chat.dump(), {auth()}).body);
  EXPECT_EQ(with_ids["prompt_token_ids"], json::parse(tokens.body)["tokens"]) << with_ids.dump();
  EXPECT_EQ(with_ids["choices"][0]["token_ids"].size(),
            with_ids["usage"]["completion_tokens"].get<size_t>())
      << with_ids.dump();
  const json completion_ids = complete({{"model", "tiny"},
                                        {"prompt", json::parse(tokens.body)["tokens"]},
                                        {"max_tokens", 4},
                                        {"temperature", 0},
                                        {"return_token_ids", true}});
  EXPECT_EQ(completion_ids["choices"][0]["prompt_token_ids"], json::parse(tokens.body)["tokens"]);
  EXPECT_EQ(completion_ids["choices"][0]["token_ids"], with_ids["choices"][0]["token_ids"]);
  chat.erase("return_token_ids");
  chat.erase("add_generation_prompt");  // true by default: refused, as vLLM does
  HttpResponse refused =
      http_request(port(), "POST", "/v1/chat/completions", chat.dump(), {auth()});
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_TRUE(wait_idle());
}

TEST_F(ServerIntegrationTest, FieldsWorkOrAreRefusedByName) {
  const std::string chat = R"("model": "tiny", "messages": [{"role": "user", "content": "x"}])";
  struct Refused {
    std::string fields;
    std::string param;
  };
  for (const Refused& c : std::vector<Refused>{
           {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}])",
            "tools[0].function.parameters"},
           {R"("tool_choice": "required")", "tool_choice"},
           {R"("parallel_tool_calls": "yes")", "parallel_tool_calls"},
           {R"("peerserve_forced_output": "x")", "peerserve_forced_output"},
           {R"("bad_words": [7])", "bad_words"},
           {R"("echo": true)", "echo"},
           {R"("min_tokens": 9, "max_tokens": 3)", "min_tokens"},
           // Checked by the engine against the vocabulary: named all the same (they were
           // reported as "messages").
           {R"("logit_bias": {"2000000000": 1})", "logit_bias"},
           {R"("stop_token_ids": [2000000000])", "stop_token_ids"},
       }) {
    HttpResponse r = http_request(port(), "POST", "/v1/chat/completions",
                                  "{" + chat + ", " + c.fields + "}", {auth()});
    EXPECT_EQ(r.status, 400) << c.fields << " -> " << r.body;
    const json body = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << r.body;
    EXPECT_EQ(body["error"]["param"], c.param) << r.body;
  }
  // `user` is accepted and never becomes a metrics label.
  HttpResponse r =
      http_request(port(), "POST", "/v1/chat/completions",
                   "{" + chat + R"(, "max_tokens": 2, "user": "user-7f3a"})", {auth()});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(metrics().find("user-7f3a"), std::string::npos);

  // min_tokens suppresses the stop token ids: with every token but one a stop token, the
  // first token ends the choice; with min_tokens = 4, four tokens come out (the one token
  // left, drawn four times) and the choice ends by length.
  const int64_t vocab = test_tokenizer_vocab_size();
  const auto run = [&](int64_t allowed, std::optional<int> min_tokens) {
    json ids = json::array();
    for (int64_t id = 0; id < vocab; ++id) {
      if (id != allowed) ids.push_back(id);
    }
    json body = {{"model", "tiny"},  {"prompt", "hello"},     {"max_tokens", 4},
                 {"temperature", 0}, {"stop_token_ids", ids}, {"ignore_eos", false}};
    if (min_tokens) body["min_tokens"] = *min_tokens;
    HttpResponse response = http_request(port(), "POST", "/v1/completions", body.dump(), {auth()});
    EXPECT_EQ(response.status, 200) << response.body;
    return json::parse(response.body, nullptr, false);
  };
  int64_t allowed = vocab - 1;
  json plain = run(allowed, std::nullopt);
  if (plain["choices"][0]["finish_reason"] != "stop") plain = run(--allowed, std::nullopt);
  ASSERT_EQ(plain["choices"][0]["finish_reason"], "stop") << plain.dump();
  EXPECT_EQ(plain["usage"]["completion_tokens"], 1) << plain.dump();
  const json held = run(allowed, 4);
  EXPECT_EQ(held["choices"][0]["finish_reason"], "length") << held.dump();
  EXPECT_EQ(held["usage"]["completion_tokens"], 4) << held.dump();

  // And stop strings: a greedy completion stopped by its own first character runs to
  // min_tokens (as in vLLM, no stop string ends in the first min_tokens tokens' text).
  json body = {{"model", "tiny"},
               {"prompt", "hello"},
               {"max_tokens", 5},
               {"temperature", 0},
               {"ignore_eos", true}};
  r = http_request(port(), "POST", "/v1/completions", body.dump(), {auth()});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string five = json::parse(r.body)["choices"][0]["text"];
  if (!five.empty()) {
    body["stop"] = five.substr(0, 1);
    body["max_tokens"] = 6;
    const json stopped =
        json::parse(http_request(port(), "POST", "/v1/completions", body.dump(), {auth()}).body);
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop") << stopped.dump();
    EXPECT_EQ(stopped["usage"]["completion_tokens"], 1) << stopped.dump();
    body["min_tokens"] = 6;
    const json held =
        json::parse(http_request(port(), "POST", "/v1/completions", body.dump(), {auth()}).body);
    EXPECT_EQ(held["usage"]["completion_tokens"], 6) << held.dump();
    EXPECT_EQ(held["choices"][0]["text"].get<std::string>().rfind(five, 0), 0u) << held.dump();
  }
  EXPECT_TRUE(wait_idle());
}

// The KV cache must hold one request of max_model_len tokens: an explicit --max-model-len
// it cannot hold is refused at start, the default one is lowered (and said so). Limits the
// model or the step budget cannot honour are refused too.
TEST(ServerKvSizingTest, MaxModelLenMustFitTheKvCache) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("peerserve_tiny_kv_" + std::to_string(::getpid()));
  TestModelOptions options;
  options.preset = TestModelPreset::kTiny;
  ASSERT_TRUE(write_test_model(dir.string(), options).ok());
  {
    ServerProcess refused;
    // Within the model's 4096 positions (the tiny preset's), beyond what 64 KiB of KV holds.
    EXPECT_FALSE(
        refused.start(dir.string(), {"--kv-cache-memory", "64KiB", "--max-model-len", "4000"}));
    EXPECT_NE(refused.read_log().find("--max-model-len 4000 is larger than the"), std::string::npos)
        << refused.read_log();
    EXPECT_NE(refused.read_log().find("tokens the KV cache holds"), std::string::npos)
        << refused.read_log();
  }
  {
    // Past the model's positions (4096 in the tiny preset): refused, whatever the cache.
    ServerProcess refused;
    EXPECT_FALSE(refused.start(dir.string(), {"--max-model-len", "4097"}));
    EXPECT_NE(refused.read_log().find(
                  "--max-model-len 4097 is larger than the model's max_position_embeddings"),
              std::string::npos)
        << refused.read_log();
  }
  {
    // Fewer tokens per step than running sequences: refused, as vLLM does.
    ServerProcess refused;
    EXPECT_FALSE(
        refused.start(dir.string(), {"--max-num-seqs", "8", "--max-num-batched-tokens", "4"}));
    EXPECT_NE(refused.read_log().find("--max-num-batched-tokens 4 is below --max-num-seqs 8"),
              std::string::npos)
        << refused.read_log();
  }
  {
    ServerProcess lowered;
    ASSERT_TRUE(lowered.start(dir.string(), {"--kv-cache-memory", "64KiB"})) << lowered.read_log();
    const std::string log = lowered.read_log();
    EXPECT_NE(log.find("note: max_model_len lowered from"), std::string::npos) << log;
    const HttpResponse models = http_request(lowered.port(), "GET", "/v1/models");
    ASSERT_EQ(models.status, 200) << models.body;
    const int64_t max_model_len = json::parse(models.body)["data"][0]["max_model_len"];
    EXPECT_GT(max_model_len, 0);
    EXPECT_LT(max_model_len, 4096);
    // A request of exactly that length is admitted rather than stuck.
    json prompt = json::array();
    for (int64_t i = 0; i + 1 < max_model_len; ++i) prompt.push_back(5);
    const HttpResponse full = http_request(lowered.port(), "POST", "/v1/completions",
                                           json{{"prompt", prompt}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(full.status, 200) << full.body;
    EXPECT_EQ(lowered.stop(), 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A server with one slot and a one-sequence queue answers 429 to the overflow, never 5xx,
// and completes the rest.
TEST(ServerQueueLimitTest, FullQueueGets429) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("peerserve_tiny_q_" + std::to_string(::getpid()));
  TestModelOptions options;
  options.preset = TestModelPreset::kTiny;
  ASSERT_TRUE(write_test_model(dir.string(), options).ok());
  ServerProcess server;
  ASSERT_TRUE(server.start(dir.string(), {"--served-model-name", "tiny", "--max-num-seqs", "1",
                                          "--max-waiting-requests", "1", "--max-model-len", "512"}))
      << server.read_log();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, too_many{0}, other{0}, retry_after{0};
  for (int i = 0; i < 12; ++i) {
    threads.emplace_back([&, i] {
      json body = {{"model", "tiny"},
                   {"prompt", "q " + std::to_string(i)},
                   {"max_tokens", 100},
                   {"ignore_eos", true}};
      HttpResponse r = http_request(server.port(), "POST", "/v1/completions", body.dump());
      if (r.status == 200) {
        ++ok;
      } else if (r.status == 429 && json::parse(r.body)["error"]["code"] == "rate_limit_exceeded") {
        ++too_many;
        retry_after += r.headers.find("\r\nRetry-After: 1") != std::string::npos;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(too_many.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(retry_after.load(), too_many.load());
  // More sequences than the queue ever holds: a 400 naming the field, not a 429 that a
  // client would retry in vain.
  for (const auto& [fields, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "q"}, {"n", 2}}, "n"},
           {{{"prompt", {"a", "b"}}}, "prompt"},
       }) {
    json body = {{"model", "tiny"}, {"max_tokens", 2}};
    body.update(fields);
    HttpResponse r = http_request(server.port(), "POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    const json error = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(error.is_discarded()) << r.body;
    EXPECT_EQ(error["error"]["param"], param) << r.body;
    EXPECT_NE(r.body.find("the waiting queue"), std::string::npos) << r.body;
  }
  EXPECT_EQ(server.stop(), 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace peerserve
