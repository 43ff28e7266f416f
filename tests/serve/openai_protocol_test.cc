#include "serve/openai_protocol.h"
#include "grammar/json_schema_regex.h"
#include "grammar/regex_automaton.h"
#include "serve/structured_output.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace peerserve {
namespace {

using json = nlohmann::json;

std::optional<ApiError> parse_completion(const std::string& text, CompletionRequest* out) {
  return parse_completion_request(json::parse(text), ApiLimits{}, out);
}
std::optional<ApiError> parse_chat(const std::string& text, ChatRequest* out) {
  return parse_chat_request(json::parse(text), ApiLimits{}, out);
}
std::string ordered_json_dump(const json& j) {
  return nlohmann::ordered_json(j).dump();
}

TEST(OpenAiProtocolTest, CompletionFieldsAreParsed) {
  CompletionRequest r;
  auto e = parse_completion(R"({"model": "m", "prompt": "hi", "max_tokens": 7,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42, "n": 2,
      "stop": ["a", "bc", 13], "stop_token_ids": [5], "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "ignore_eos": true, "logprobs": 3, "stream": true,
      "stream_options": {"include_usage": true}})",
                            &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "hi");
  const GenerationParams& p = r.params;
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.05f);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.stop_strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<TokenId>{13, 5}));
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -0.5f);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_TRUE(p.sampling.want_logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.continuous_usage);
  CompletionRequest running;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "stream": true, "stream_options":
                                     {"include_usage": true, "continuous_usage_stats": true}})",
                                &running));
  EXPECT_TRUE(running.continuous_usage);
  // As vLLM: per-chunk usage only with include_usage.
  CompletionRequest alone;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": true}})",
      &alone));
  EXPECT_FALSE(alone.continuous_usage);
  CompletionRequest bad;
  auto refused = parse_completion(
      R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": 1}})", &bad);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->param, "stream_options");
}

// logit_bias as OpenAI and vLLM take it (string token ids, values clamped to [-100, 100]);
// seed -1 is "no seed", as in vLLM.
TEST(OpenAiProtocolTest, LogitBiasAndSeedMinusOne) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": "x", "logit_bias": {"5": 2.5, "7": -300, "9": 1e9}, "seed": -1})", &r));
  auto bias = r.params.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<TokenId, float>>{{5, 2.5f}, {7, -100.0f}, {9, 100.0f}}));
  EXPECT_FALSE(r.params.sampling.seed.has_value());
  CompletionRequest seeded;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "seed": -2, "logit_bias": null})", &seeded));
  EXPECT_EQ(seeded.params.sampling.seed, static_cast<uint64_t>(int64_t{-2}));
  EXPECT_TRUE(seeded.params.sampling.logit_bias.empty());
}

TEST(OpenAiProtocolTest, PromptForms) {
  CompletionRequest a, b, c;
  ASSERT_FALSE(parse_completion(R"({"prompt": ["x", "y"]})", &a));
  EXPECT_EQ(a.prompts.size(), 2u);
  ASSERT_FALSE(parse_completion(R"({"prompt": [1, 2, 3]})", &b));
  ASSERT_EQ(b.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::vector<TokenId>>(b.prompts[0]), (std::vector<TokenId>{1, 2, 3}));
  ASSERT_FALSE(parse_completion(R"({"prompt": [[1, 2], [3]]})", &c));
  EXPECT_EQ(c.prompts.size(), 2u);
}

// The bad-input matrix: each case names the offending parameter in `param`.
TEST(OpenAiProtocolTest, BadCompletionInputsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": [{"a": 1}]})", "prompt"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": -1})", "temperature"},
      {R"({"prompt": "x", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "x", "top_p": 0})", "top_p"},
      {R"({"prompt": "x", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "top_k": 1.5})", "top_k"},
      {R"({"prompt": "x", "min_p": 2})", "min_p"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 1000})", "n"},
      {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": -3})", "frequency_penalty"},
      {R"({"prompt": "x", "stop": ""})", "stop"},
      {R"({"prompt": "x", "stop": [true]})", "stop"},
      {R"({"prompt": "x", "stop": {"a": 1}})", "stop"},
      {R"({"prompt": "x", "stop_token_ids": 5})", "stop_token_ids"},
      {R"({"prompt": "x", "seed": "abc"})", "seed"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "stream": true, "stream_options": 3})", "stream_options"},
      {R"({"prompt": "x", "logprobs": 50})", "logprobs"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "prompt_logprobs": 21})", "prompt_logprobs"},
      {R"({"prompt": "x", "prompt_logprobs": -1})", "prompt_logprobs"},
      {R"({"prompt": "x", "stream": true, "prompt_logprobs": 0})", "prompt_logprobs"},
      {R"({"prompt": "x", "echo": true, "max_tokens": 0, "min_tokens": 1})", "min_tokens"},
      {R"({"prompt": "x", "echo": true, "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "x", "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "logit_bias": {"a5": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"-5": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": "1"}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": [5]})", "logit_bias"},
      {R"({"prompt": "x", "add_special_tokens": 0})", "add_special_tokens"},
      {R"({"prompt": "x", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens"},
      {R"({"prompt": "x", "truncate_prompt_tokens": -2})", "truncate_prompt_tokens"},
      {R"({"prompt": "x", "return_token_ids": 1})", "return_token_ids"},
      {R"({"prompt": "x", "logprob_token_ids": [3]})", "logprob_token_ids"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "x", "model": 5})", "model"},
  };
  for (const Case& c : cases) {
    CompletionRequest r;
    auto e = parse_completion(c.body, &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->type, "invalid_request_error") << c.body;
    ASSERT_TRUE(e->param.has_value()) << c.body;
    EXPECT_EQ(*e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_FALSE(e->message.empty());
  }
  CompletionRequest r;
  auto e = parse_completion_request(json::array({1}), ApiLimits{}, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("JSON object"), std::string::npos);
}

TEST(OpenAiProtocolTest, KvPushTargetIsParsedAndChecked) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": [1, 2, 3], "peerserve_kv_push": {"endpoint": "10.0.0.7:4100",
          "transfer": "handoff-ab12-7", "first_block": 3, "tail": true}})",
      &r));
  ASSERT_TRUE(r.kv_push.has_value());
  EXPECT_EQ(r.kv_push->endpoint, "10.0.0.7:4100");
  EXPECT_EQ(r.kv_push->transfer, "handoff-ab12-7");
  EXPECT_EQ(r.kv_push->first_block, 3);
  EXPECT_TRUE(r.kv_push->tail);
  CompletionRequest none;
  ASSERT_FALSE(parse_completion(R"({"prompt": [1]})", &none));
  EXPECT_FALSE(none.kv_push.has_value());
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": [1], "peerserve_kv_push": 5})", "peerserve_kv_push"},
      {R"({"prompt": [[1], [2]], "peerserve_kv_push": {"endpoint": "h:1", "transfer": "t"}})",
       "peerserve_kv_push"},
      {R"({"prompt": [1], "peerserve_kv_push": {"transfer": "t"}})", "peerserve_kv_push.endpoint"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h", "transfer": "t"}})",
       "peerserve_kv_push.endpoint"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:0", "transfer": "t"}})",
       "peerserve_kv_push.endpoint"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:99999", "transfer": "t"}})",
       "peerserve_kv_push.endpoint"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": ":80", "transfer": "t"}})",
       "peerserve_kv_push.endpoint"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:80", "transfer": "a/b"}})",
       "peerserve_kv_push.transfer"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:80"}})",
       "peerserve_kv_push.transfer"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:80", "transfer": "t",
          "first_block": -1}})",
       "peerserve_kv_push.first_block"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:80", "transfer": "t",
          "first_block": 1e12}})",
       "peerserve_kv_push.first_block"},
      {R"({"prompt": [1], "peerserve_kv_push": {"endpoint": "h:80", "transfer": "t",
          "tail": 1}})",
       "peerserve_kv_push.tail"},
  };
  for (const Case& c : cases) {
    CompletionRequest bad;
    auto e = parse_completion(c.body, &bad);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    ASSERT_TRUE(e->param.has_value()) << c.body;
    EXPECT_EQ(*e->param, c.param) << c.body << " -> " << e->message;
  }
}

// A router's prefill suggestion: kept as given (the decode instance checks it against its
// own list), refused when it is not a string of sensible length.
TEST(OpenAiProtocolTest, PrefillHintIsParsedAndChecked) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion(R"({"prompt": [1], "peerserve_prefill": "10.0.0.1:8001"})", &r));
  EXPECT_EQ(r.prefill_hint, "10.0.0.1:8001");
  CompletionRequest none;
  ASSERT_FALSE(parse_completion(R"({"prompt": [1]})", &none));
  EXPECT_EQ(none.prefill_hint, "");
  const std::string too_long =
      R"({"prompt": [1], "peerserve_prefill": ")" + std::string(301, 'h') + R"("})";
  for (const std::string& body :
       {std::string(R"({"prompt": [1], "peerserve_prefill": 5})"),
        std::string(R"({"prompt": [1], "peerserve_prefill": ""})"), too_long}) {
    CompletionRequest bad;
    auto e = parse_completion(body, &bad);
    ASSERT_TRUE(e.has_value()) << body;
    ASSERT_TRUE(e->param.has_value());
    EXPECT_EQ(*e->param, "peerserve_prefill");
  }
}

// A completion without max_tokens gets at most 16 (OpenAI's legacy API and vLLM; it ran to
// the end of the context), within the context (the engine caps it: a prompt near the end
// is not refused); a chat request runs to the end of the context.
TEST(OpenAiProtocolTest, CompletionsDefaultToSixteenTokens) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x"})", &r));
  EXPECT_FALSE(r.params.max_tokens.has_value());
  EXPECT_EQ(r.params.default_max_tokens, 16);
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "max_tokens": 200})", &r));
  EXPECT_EQ(r.params.max_tokens, 200);
  ChatRequest chat;
  ASSERT_FALSE(parse_chat(R"({"messages": [{"role": "user", "content": "hi"}]})", &chat));
  EXPECT_FALSE(chat.params.max_tokens.has_value());
  EXPECT_FALSE(chat.params.default_max_tokens.has_value());
}

// vLLM's cache_salt, on both endpoints: kept as given (null: none, as in vLLM); refused when
// empty (that would share the cache silently), too long or not a string.
TEST(OpenAiProtocolTest, CacheSaltIsParsedAndChecked) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion(R"({"prompt": [1], "cache_salt": "tenant-a"})", &r));
  EXPECT_EQ(r.cache_salt, "tenant-a");
  ChatRequest chat;
  ASSERT_FALSE(parse_chat(
      R"({"messages": [{"role": "user", "content": "hi"}], "cache_salt": "tenant-b"})", &chat));
  EXPECT_EQ(chat.cache_salt, "tenant-b");
  CompletionRequest none;
  ASSERT_FALSE(parse_completion(R"({"prompt": [1]})", &none));
  EXPECT_EQ(none.cache_salt, "");
  ASSERT_FALSE(parse_completion(R"({"prompt": [1], "cache_salt": null})", &none));
  EXPECT_EQ(none.cache_salt, "");
  CompletionRequest longest;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": [1], "cache_salt": ")" + std::string(kMaxCacheSaltBytes, 's') + R"("})",
      &longest));
  EXPECT_EQ(longest.cache_salt.size(), kMaxCacheSaltBytes);
  for (const std::string& body : {std::string(R"({"prompt": [1], "cache_salt": 5})"),
                                  std::string(R"({"prompt": [1], "cache_salt": ""})"),
                                  R"({"prompt": [1], "cache_salt": ")" +
                                      std::string(kMaxCacheSaltBytes + 1, 's') + R"("})"}) {
    CompletionRequest bad;
    auto e = parse_completion(body, &bad);
    ASSERT_TRUE(e.has_value()) << body.substr(0, 60);
    EXPECT_EQ(e->status, 400);
    ASSERT_TRUE(e->param.has_value());
    EXPECT_EQ(*e->param, "cache_salt");
  }
}

TEST(OpenAiProtocolTest, ChatMessagesAreNormalised) {
  ChatRequest r;
  auto e = parse_chat(R"({"messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": []}],
      "max_completion_tokens": 9, "max_tokens": 3, "logprobs": true, "top_logprobs": 2})",
                      &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_FALSE(r.messages[2].contains("tool_calls"));  // an empty list is no call turn
  EXPECT_EQ(r.params.max_tokens, 9);                   // max_completion_tokens wins
  EXPECT_TRUE(r.params.sampling.want_logprobs);
  EXPECT_EQ(r.params.sampling.top_logprobs, 2);
  EXPECT_TRUE(r.add_generation_prompt);
}

// The chat template sees the request's objects in the order they were sent, as transformers
// does (nlohmann::json sorts keys: tools printed with tojson came out sorted), with the
// parser's changes (developer -> system, content parts joined) in place.
TEST(OpenAiProtocolTest, ChatTemplateInputKeepsTheOrderSent) {
  const std::string body = R"({"model": "m", "messages": [
      {"role": "developer", "content": "be brief", "name": "ops"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
      "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                                                      "days": {"type": "integer"}},
                     "required": ["location"]}}}],
    "chat_template_kwargs": {"zeta": {"y": 1, "x": 2}}})";
  ChatRequest chat;
  ASSERT_FALSE(parse_chat(body, &chat).has_value());
  const ChatTemplateInput input = chat_template_input(body, chat);
  EXPECT_EQ(input.extra_variables["tools"].dump(),
            R"([{"type":"function","function":{"name":"get_weather","description":"d",)"
            R"("parameters":{"type":"object","properties":{"location":{"type":"string"},)"
            R"("days":{"type":"integer"}},"required":["location"]}}}])");
  EXPECT_EQ(input.extra_variables["zeta"].dump(), R"({"y":1,"x":2})");
  EXPECT_EQ(input.messages.dump(), R"([{"role":"system","content":"be brief","name":"ops"},)"
                                   R"({"role":"user","content":"a\nb"}])");
  EXPECT_TRUE(input.add_generation_prompt);
  // A body that cannot be read again (or with an object too large to keep in order): the
  // parser's own objects, sorted.
  const ChatTemplateInput fallback = chat_template_input("{", chat);
  EXPECT_EQ(fallback.messages.dump(), ordered_json_dump(chat.messages));

  // Members the template does not see are not counted against the bounds, however large
  // (a 600-key metadata object before the messages made the ordered copy give up).
  json metadata = json::object();
  for (int i = 0; i < 600; ++i) metadata["k" + std::to_string(i)] = i;
  const std::string with_metadata = R"({"metadata": )" + metadata.dump() +
                                    R"(, "response_format": {"type": "text"}, "model": "m",
      "messages": [{"role": "user", "content": "x", "name": "n"}]})";
  ChatRequest small;
  ASSERT_FALSE(parse_chat(with_metadata, &small).has_value());
  EXPECT_EQ(chat_template_input(with_metadata, small).messages.dump(),
            R"([{"role":"user","content":"x","name":"n"}])");
  // A message with more keys than the bound: the sorted objects (no quadratic parse).
  json wide = {{"role", "user"}, {"content", "x"}};
  for (int i = 0; i < 600; ++i) wide["z" + std::to_string(i)] = i;
  const std::string wide_body = json({{"messages", json::array({wide})}}).dump();
  ChatRequest wide_chat;
  ASSERT_FALSE(parse_chat(wide_body, &wide_chat).has_value());
  EXPECT_EQ(chat_template_input(wide_body, wide_chat).messages.dump(),
            ordered_json_dump(wide_chat.messages));
}

TEST(OpenAiProtocolTest, BadChatInputs) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [5]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "yaml"}})",
       "response_format"},
      // A type that is not a string once threw out of the parser and ended the server.
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": 1}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": null}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": "text"})",
       "response_format"},
  };
  for (const Case& c : cases) {
    ChatRequest r;
    auto e = parse_chat(c.body, &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400);
    ASSERT_TRUE(e->param.has_value()) << c.body;
    EXPECT_EQ(*e->param, c.param) << c.body << " -> " << e->message;
  }
}

TEST(OpenAiProtocolTest, ErrorJsonHasOpenAiShape) {
  ApiError e;
  e.status = 404;
  e.message = "no \"such\" model";
  e.param = "model";
  e.code = "model_not_found";
  json j = json::parse(api_error_json(e));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["message"], "no \"such\" model");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  ApiError bare;
  bare.message = "x";
  j = json::parse(api_error_json(bare));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiProtocolTest, StatusMapping) {
  EXPECT_EQ(api_error_from_status(invalid_argument("x")).status, 400);
  EXPECT_EQ(api_error_from_status(out_of_range("x")).status, 400);
  EXPECT_EQ(api_error_from_status(out_of_range("x")).code, "context_length_exceeded");
  EXPECT_EQ(api_error_from_status(not_found("x")).status, 404);
  EXPECT_EQ(api_error_from_status(resource_exhausted("x")).status, 429);
  EXPECT_EQ(api_error_from_status(unavailable("x")).status, 503);
  EXPECT_EQ(api_error_from_status(internal_error("x")).status, 500);
  EXPECT_EQ(api_error_from_status(internal_error("x")).type, "server_error");
}

TEST(OpenAiProtocolTest, UsageJson) {
  Usage u;
  u.prompt_tokens = 5;
  u.completion_tokens = 7;
  u.cached_prompt_tokens = 4;
  json j = usage_json(u);
  EXPECT_EQ(j["total_tokens"], 12);
  EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiProtocolTest, SanitizeUtf8) {
  EXPECT_EQ(sanitize_utf8("plain"), "plain");
  EXPECT_EQ(sanitize_utf8("é中😀"), "é中😀");
  EXPECT_EQ(sanitize_utf8("a\xff"
                          "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(sanitize_utf8("\xE4\xB8"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated 3-byte char
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

// echo (the prompt's text and logprobs before the answer's), max_tokens 0 with it (the prompt
// alone) and vLLM's prompt_logprobs, which echo with logprobs implies.
TEST(OpenAiProtocolTest, EchoAndPromptLogprobs) {
  CompletionRequest plain;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "echo": false})", &plain));
  EXPECT_FALSE(plain.echo);
  EXPECT_FALSE(plain.params.prompt_logprobs.has_value());

  CompletionRequest echo;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "echo": true, "max_tokens": 5})", &echo));
  EXPECT_TRUE(echo.echo);
  EXPECT_FALSE(echo.echo_only);
  EXPECT_FALSE(echo.params.prompt_logprobs.has_value());  // no logprobs asked

  CompletionRequest scoring;  // how evaluation harnesses score a text
  ASSERT_FALSE(parse_completion(
      R"({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 3, "temperature": 0})",
      &scoring));
  EXPECT_TRUE(scoring.echo_only);
  EXPECT_EQ(scoring.params.max_tokens, 1);  // computed, not sent
  EXPECT_EQ(scoring.params.prompt_logprobs, 3);
  EXPECT_FALSE(scoring.prompt_logprobs.has_value());  // no vLLM field in the answer

  CompletionRequest both;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": "x", "echo": true, "logprobs": 2, "prompt_logprobs": 5})", &both));
  EXPECT_EQ(both.params.prompt_logprobs, 5);  // the larger of the two
  EXPECT_EQ(both.prompt_logprobs, 5);
  CompletionRequest field_only;
  ASSERT_FALSE(parse_completion(R"({"prompt": "x", "prompt_logprobs": 0})", &field_only));
  EXPECT_EQ(field_only.params.prompt_logprobs, 0);
  EXPECT_FALSE(field_only.echo);

  CompletionRequest truncated;
  ASSERT_FALSE(parse_completion(
      R"({"prompt": "x", "truncate_prompt_tokens": 7, "add_special_tokens": false})", &truncated));
  EXPECT_EQ(truncated.truncate_prompt_tokens, 7);
  EXPECT_FALSE(truncated.add_special_tokens);
  CompletionRequest whole_context;
  ASSERT_FALSE(
      parse_completion(R"({"prompt": "x", "truncate_prompt_tokens": -1})", &whole_context));
  EXPECT_EQ(whole_context.truncate_prompt_tokens, -1);
  EXPECT_TRUE(whole_context.add_special_tokens);

  CompletionRequest zero;
  auto e = parse_completion(R"({"prompt": "x", "max_tokens": 0})", &zero);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("echo"), std::string::npos) << e->message;
}

TEST(OpenAiProtocolTest, EchoAndPromptLogprobsJson) {
  std::vector<PromptTokenLogprob> prompt = {{5, -1.5f, 3, {{9, -0.25f}, {5, -1.5f}}},
                                            {6, -std::numeric_limits<float>::infinity(), 40, {}}};
  SampledToken generated;
  generated.token = 7;
  generated.logprob = -0.5f;
  const json echo = completion_echo_logprobs_json(4, prompt, {generated}, nullptr, 1, 0);
  EXPECT_EQ(echo["tokens"], json({"token_id:4", "token_id:5", "token_id:6", "token_id:7"}));
  EXPECT_EQ(echo["token_logprobs"], json({nullptr, -1.5, -9999.0, -0.5}));
  EXPECT_TRUE(echo["top_logprobs"][0].is_null());
  EXPECT_EQ(echo["top_logprobs"][1], json({{"token_id:5", -1.5}, {"token_id:9", -0.25}}));
  EXPECT_EQ(echo["text_offset"], json({0, 10, 20, 30}));

  const std::string vllm = prompt_logprobs_json(prompt, nullptr, 2).dump();
  EXPECT_EQ(vllm, R"([null,{"5":{"logprob":-1.5,"rank":3,"decoded_token":"token_id:5"},)"
                  R"("9":{"logprob":-0.25,"rank":1,"decoded_token":"token_id:9"}},)"
                  R"({"6":{"logprob":-9999.0,"rank":40,"decoded_token":"token_id:6"}}])");
  EXPECT_EQ(prompt_logprobs_json({}, nullptr, 0).dump(), "[null]");
}

TEST(OpenAiProtocolTest, CompletionLogprobsOffsets) {
  std::vector<SampledToken> toks(2);
  toks[0].token = 7;
  toks[0].logprob = -0.5f;
  toks[0].top_logprobs = {{7, -0.5f}, {8, -1.5f}};
  toks[1].token = 8;
  toks[1].logprob = -std::numeric_limits<float>::infinity();
  json j = completion_logprobs_json(toks, nullptr, 1, 10);
  EXPECT_EQ(j["tokens"][0], "token_id:7");
  EXPECT_EQ(j["token_logprobs"][1], -9999.0);
  EXPECT_EQ(j["text_offset"][0], 10);
  EXPECT_EQ(j["text_offset"][1], 10 + std::string("token_id:7").size());
  EXPECT_EQ(j["top_logprobs"][0].size(), 1u);
  // The sampled token is in its top_logprobs even when it is not among the most likely
  // (OpenAI: up to logprobs + 1 entries).
  ASSERT_EQ(j["top_logprobs"][1].size(), 1u);
  EXPECT_EQ(j["top_logprobs"][1]["token_id:8"], -9999.0);
  json two = completion_logprobs_json(toks, nullptr, 0, 0);
  EXPECT_EQ(two["top_logprobs"][0], json({{"token_id:7", -0.5}}));
  // As vLLM writes them: the sampled token, then the most likely first (JSON object order;
  // the keys sorted put token_id:10 before token_id:9).
  SampledToken ranked;
  ranked.token = 11;
  ranked.logprob = -2.0f;
  ranked.top_logprobs = {{9, -0.1f}, {10, -1.0f}, {11, -2.0f}};
  const std::string text =
      completion_logprobs_json({ranked}, nullptr, 3, 0)["top_logprobs"][0].dump();
  EXPECT_EQ(text, R"({"token_id:11":-2.0,"token_id:9":-0.10000000149011612,"token_id:10":-1.0})");
}

// text_offset counts characters, as OpenAI's and vLLM's do, not UTF-8 bytes.
TEST(OpenAiProtocolTest, CompletionTextOffsetsCountCharacters) {
  const char* source = std::getenv("PEERSERVE_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  auto tokenizer = Tokenizer::load_from_dir(std::string(source) + "/models/peerserve-dsv3-tiny");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  // A byte-level token that is not ASCII: its text is one or more characters of 2 to 3
  // bytes each (a partial sequence shows as U+FFFD, 3 bytes).
  TokenId wide = -1;
  for (TokenId id = 0; id < 4096 && wide < 0; ++id) {
    if (!tokenizer->has_token(id)) continue;
    const std::string_view b = tokenizer->token_bytes(id);
    if (b.size() == 1 && static_cast<unsigned char>(b[0]) >= 0x80) wide = id;
  }
  ASSERT_GE(wide, 0) << "no non-ASCII byte token in the shipped tokenizer";
  std::vector<SampledToken> toks(2);
  toks[0].token = wide;
  toks[1].token = wide;
  const json j = completion_logprobs_json(toks, &*tokenizer, 0, 5);
  const std::string text = j["tokens"][0];
  ASSERT_EQ(text, "\xEF\xBF\xBD");  // U+FFFD: 1 character, 3 bytes
  EXPECT_EQ(j["text_offset"][0], 5);
  EXPECT_EQ(j["text_offset"][1], 6);  // was 8 (bytes)
}

// A refused pattern is remembered: a pattern over the automaton's bounds costs up to a second
// or two before the refusal, and a client may send the same one with every request.
TEST(StructuredOutputCompilerTest, RemembersRefusedPatterns) {
  const char* source = std::getenv("PEERSERVE_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  auto tokenizer = Tokenizer::load_from_dir(std::string(source) + "/models/peerserve-dsv3-tiny");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  StructuredOutputCompiler compiler(*tokenizer, {1}, /*cache_entries=*/2);
  // The 17th character from the end is an 'a': 2^17 states, over the 65,536 allowed.
  const std::string too_large = "(a|b)*a(a|b){16}";
  const auto first = compiler.compile(too_large);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(compiler.compilations(), 1u);
  const auto again = compiler.compile(too_large);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), first.status().message());
  EXPECT_EQ(compiler.compilations(), 1u);
  // Refusals and constraints are kept apart; both stay within the cache size.
  ASSERT_TRUE(compiler.compile("[a-z]+").ok());
  ASSERT_TRUE(compiler.compile("[a-z]+").ok());
  EXPECT_EQ(compiler.compilations(), 2u);
  EXPECT_FALSE(compiler.compile("(").ok());
  EXPECT_FALSE(compiler.compile("[").ok());
  EXPECT_EQ(compiler.compilations(), 4u);
  // Two newer refusals pushed the first out: it is compiled (and refused) again.
  EXPECT_FALSE(compiler.compile(too_large).ok());
  EXPECT_EQ(compiler.compilations(), 5u);
  ASSERT_TRUE(compiler.compile("[a-z]+").ok());
  EXPECT_EQ(compiler.compilations(), 5u);
  // Longer than any pattern the automaton takes: refused at once, and not kept.
  const std::string huge(grammar::RegexLimits{}.max_pattern_bytes + 1, 'a');
  EXPECT_FALSE(compiler.compile(huge).ok());
  EXPECT_FALSE(compiler.compile(huge).ok());
  EXPECT_EQ(compiler.compilations(), 7u);
  EXPECT_FALSE(compiler.compile(too_large).ok());
  EXPECT_EQ(compiler.compilations(), 7u);
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

std::optional<ApiError> parse_body_text(const std::string& text, nlohmann::json* out,
                                        ApiLimits limits = {}) {
  return parse_json_body(text, limits, out);
}

// A `tools` array nested 300,000 deep (600 KB) must be refused before any JSON value is
// built: the copies, dumps and template conversions behind the parser recurse.
TEST(JsonBodyTest, DeepNestingIsRefusedBeforeParsing) {
  const int kDeep = 300000;
  const std::string body =
      R"({"messages": [], "tools": )" + std::string(kDeep, '[') + std::string(kDeep, ']') + "}";
  nlohmann::json parsed;
  auto e = parse_body_text(body, &parsed);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("nested deeper than 64"), std::string::npos) << e->message;

  // Exactly at the limit is fine; one more is not.
  ApiLimits limits;
  limits.max_json_depth = 4;
  EXPECT_FALSE(parse_body_text(R"({"a": [{"b": []}]})", &parsed, limits).has_value());
  EXPECT_TRUE(parse_body_text(R"({"a": [{"b": [[]]}]})", &parsed, limits).has_value());
  // Brackets inside strings (escaped quotes included) do not count.
  EXPECT_FALSE(
      parse_body_text(R"({"a": "[[[[[[{{{{\"[[[[[", "b": ["]]]]"]})", &parsed, limits).has_value());
  EXPECT_EQ(parsed["a"], "[[[[[[{{{{\"[[[[[");
}

TEST(JsonBodyTest, InvalidJsonIsAClearError) {
  nlohmann::json parsed;
  for (const char* bad : {"", "{", "{\"a\": }", "[1, 2", "\"\\u12\"", "nul"}) {
    auto e = parse_body_text(bad, &parsed);
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_EQ(e->message, "the request body is not valid JSON");
  }
}

// A lone surrogate escape is valid JSON; Python's json module and OpenAI's server accept
// it. It becomes U+FFFD; a proper pair stays the character it encodes.
TEST(JsonBodyTest, LoneSurrogatesBecomeReplacementCharacters) {
  nlohmann::json parsed;
  ASSERT_FALSE(parse_body_text(R"({"p": "a\ud800b", "q": "\udc00", "r": "\ud83d\ude00",
                                   "s": "\ud800\ud800x", "t": "\\ud800", "u": "x\uD83D"})",
                               &parsed)
                   .has_value());
  EXPECT_EQ(parsed["p"],
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(parsed["q"], "\xEF\xBF\xBD");
  EXPECT_EQ(parsed["r"], "\xF0\x9F\x98\x80");
  EXPECT_EQ(parsed["s"], "\xEF\xBF\xBD\xEF\xBF\xBDx");
  EXPECT_EQ(parsed["t"], "\\ud800");  // an escaped backslash, then plain text
  EXPECT_EQ(parsed["u"], "x\xEF\xBF\xBD");
}

// 2^63 does not fit an int64: the message must print it as sent, not as a negative number.
TEST(JsonBodyTest, HugeIntegersArePrintedAsSent) {
  // seed too: 2^63 and above were clamped to 2^63 - 1 (different seeds, the same samples).
  for (const char* field : {"max_tokens", "n", "top_k", "seed"}) {
    CompletionRequest r;
    nlohmann::json body = nlohmann::json::parse(std::string(R"({"prompt": "x", ")") + field +
                                                R"(": 9223372036854775808})");
    auto e = parse_completion_request(body, ApiLimits{}, &r);
    ASSERT_TRUE(e.has_value()) << field;
    EXPECT_EQ(e->param, field);
    EXPECT_NE(e->message.find("got 9223372036854775808"), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find("got -9223372036854775808"), std::string::npos) << e->message;
  }
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// Every field is implemented or refused by name; none is silently ignored.
TEST(RequestFieldsTest, EachFieldWorksOrIsRefusedByName) {
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  const auto chat = [&](const std::string& fields, ChatRequest* out) {
    return parse_chat_request(nlohmann::json::parse("{" + messages + ", " + fields + "}"),
                              ApiLimits{}, out);
  };
  struct Refused {
    const char* fields;
    const char* param;
  };
  for (const Refused& c : {
           Refused{R"("tools": [{"type": "function", "function": {"name": "f g"}}])",
                   "tools[0].function.name"},
           Refused{R"("tools": {})", "tools"},
           Refused{R"("tool_choice": "required")", "tool_choice"},
           Refused{R"("tool_choice": {"type": "function", "function": {"name": "f"}})",
                   "tool_choice"},
           Refused{R"("parallel_tool_calls": 1)", "parallel_tool_calls"},
           Refused{R"("functions": [])", "functions"},
           Refused{R"("function_call": "auto")", "function_call"},
           Refused{R"("echo": true)", "echo"},
           Refused{R"("bad_words": ["x", {}])", "bad_words"},
           Refused{R"("user": 5)", "user"},
           Refused{R"("min_tokens": -1)", "min_tokens"},
           Refused{R"("min_tokens": 5, "max_tokens": 4)", "min_tokens"},
           Refused{R"("min_tokens": 5, "max_completion_tokens": 4)", "min_tokens"},
           // vLLM's extensions that are not built (they were ignored: free text came back).
           Refused{R"("guided_grammar": "root ::= x")", "guided_grammar"},
           Refused{R"("structured_outputs": {"grammar": "x"})", "structured_outputs"},
           Refused{R"("structured_outputs": {"structural_tag": "x"})", "structured_outputs"},
           // Structured outputs: malformed, or two kinds at once.
           Refused{R"("guided_choice": [])", "guided_choice"},
           Refused{R"("guided_choice": ["a", 1])", "guided_choice"},
           Refused{R"("guided_regex": 5)", "guided_regex"},
           Refused{R"("guided_json": {"type": "string", "not": {}})", "guided_json"},
           Refused{R"("guided_json": "{not json")", "guided_json"},
           Refused{R"("guided_regex": "a", "guided_choice": ["a"])", "guided_choice"},
           Refused{R"("guided_regex": "a", "response_format": {"type": "json_object"})",
                   "response_format"},
           Refused{R"("response_format": {"type": "json_schema"})", "response_format"},
           Refused{
               R"("guided_regex": "a", "tools": [{"type": "function", "function": {"name": "f"}}])",
               "guided_regex"},
           Refused{R"("prompt_logprobs": 1, "stream": true)", "prompt_logprobs"},
           Refused{R"("allowed_token_ids": [])", "allowed_token_ids"},
           Refused{R"("allowed_token_ids": [1, -2])", "allowed_token_ids"},
           Refused{R"("allowed_token_ids": 5)", "allowed_token_ids"},
           Refused{R"("truncate_prompt_tokens": 0)", "truncate_prompt_tokens"},
           Refused{R"("use_beam_search": true)", "use_beam_search"},
           Refused{R"("length_penalty": 0.5)", "length_penalty"},
           Refused{R"("continue_final_message": true)", "continue_final_message"},
           Refused{R"("continue_final_message": 1, "add_generation_prompt": false)",
                   "continue_final_message"},
           Refused{R"("chat_template": "{{ 1 }}")", "chat_template"},
           Refused{R"("documents": [{"text": "a"}])", "documents"},
           Refused{R"("add_special_tokens": true)", "add_special_tokens"},
           Refused{R"("thinking_token_budget": 10)", "thinking_token_budget"},
       }) {
    ChatRequest r;
    auto e = chat(c.fields, &r);
    ASSERT_TRUE(e.has_value()) << c.fields;
    EXPECT_EQ(e->param, c.param) << c.fields << " -> " << e->message;
    EXPECT_NE(e->message.find(c.param), std::string::npos) << e->message;
  }
  ChatRequest r;
  ASSERT_FALSE(chat(R"("user": "alice", "tools": [], "tool_choice": "none", "echo": false,
                       "bad_words": [], "min_tokens": 4, "max_tokens": 4,
                       "guided_json": null, "use_beam_search": false, "length_penalty": 1.0,
                       "prompt_logprobs": null, "add_special_tokens": false,
                       "continue_final_message": false, "stream_interval": 1)",
                    &r)
                   .has_value());
  EXPECT_EQ(r.params.sampling.min_tokens, 4);
  // None, as transformers and vLLM pass it: `tools is not none` is false, not undefined.
  ASSERT_TRUE(r.template_variables.contains("tools"));
  EXPECT_TRUE(r.template_variables["tools"].is_null());

  // Tools: auto by default, handed to the template; "none" keeps them out of it; a named
  // function must be one of them.
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
          {"type": "object"}}}, {"type": "function", "function": {"name": "f-2"}}])";
  ChatRequest t;
  ASSERT_FALSE(chat(tools, &t).has_value());
  EXPECT_EQ(t.tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_EQ(t.template_variables["tools"].size(), 2u);
  EXPECT_TRUE(t.parallel_tool_calls);
  ChatRequest none;
  ASSERT_FALSE(chat(tools + R"(, "tool_choice": "none")", &none).has_value());
  EXPECT_EQ(none.tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_TRUE(none.template_variables["tools"].is_null());
  ChatRequest named;
  ASSERT_FALSE(chat(tools + R"(, "parallel_tool_calls": false,
                    "tool_choice": {"type": "function", "function": {"name": "f-2"}})",
                    &named)
                   .has_value());
  EXPECT_EQ(named.tool_choice.mode, ToolChoice::Mode::kNamed);
  EXPECT_EQ(named.tool_choice.function_name, "f-2");
  EXPECT_FALSE(named.parallel_tool_calls);
  ChatRequest required;
  ASSERT_FALSE(chat(tools + R"(, "tool_choice": "required")", &required).has_value());
  EXPECT_EQ(required.tool_choice.mode, ToolChoice::Mode::kRequired);

  CompletionRequest c;
  ASSERT_FALSE(parse_completion_request(
                   nlohmann::json::parse(R"({"prompt": "x", "min_tokens": 3, "user": "u"})"),
                   ApiLimits{}, &c)
                   .has_value());
  EXPECT_EQ(c.params.sampling.min_tokens, 3);
  CompletionRequest words;
  ASSERT_FALSE(parse_completion_request(
                   nlohmann::json::parse(R"({"prompt": "x", "bad_words": ["a", " b c"]})"),
                   ApiLimits{}, &words)
                   .has_value());
  EXPECT_EQ(words.bad_words, (std::vector<std::string>{"a", " b c"}));
  for (const char* bad :
       {R"("bad_words": "a")", R"("bad_words": ["a", 1])", R"("bad_words": [""])"}) {
    auto e = parse_completion_request(
        nlohmann::json::parse(std::string(R"({"prompt": "x", )") + bad + "}"), ApiLimits{}, &c);
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_EQ(e->param, "bad_words");
  }
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// Each way of asking for a structured output gives a pattern with the meaning asked for (the
// pattern compiled and tried on answers), and names its field.
TEST(StructuredOutputRequestTest, EachFormGivesItsLanguage) {
  struct Form {
    const char* fields;
    const char* field;
    std::vector<std::string> matching, not_matching;
    bool any_object = false;
  };
  const std::vector<Form> forms = {
      {R"("guided_choice": ["yes", "no."])", "guided_choice", {"yes", "no."}, {"no", "maybe"}},
      {R"("guided_regex": "[0-9]{2}x")", "guided_regex", {"12x"}, {"1x", "12"}},
      {R"("structured_outputs": {"choice": ["a|b"]})", "structured_outputs", {"a|b"}, {"a"}},
      {R"("structured_outputs": {"regex": "a+"})", "structured_outputs", {"aaa"}, {"b"}},
      {R"("guided_json": {"type": "object", "properties": {"n": {"type": "integer"}},
                          "required": ["n"]})",
       "guided_json",
       {R"({"n":12})", R"({ "n": -3 })"},
       {R"({"n":"12"})", R"({})", R"({"n":1,"m":2})"}},
      {R"("guided_json": "{\"type\": \"boolean\"}")", "guided_json", {"true"}, {"1"}},
      {R"("guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}},
          "guided_whitespace_pattern": "")",
       "guided_json",
       {R"({"n":1})", "{}"},
       {R"({"n": 1})"}},
      // json_object: grammar/json_schema_regex's any-object pattern (its own test compiles and
      // tries it; compiling it here again took 20 s under the sanitizers).
      {R"("response_format": {"type": "json_object"})", "response_format", {}, {}, true},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"type": "array", "items": {"type": "string"}, "maxItems": 1}}})",
       "response_format",
       {R"(["x"])", "[]"},
       {R"(["x","y"])", "[1]"}},
      {R"("structured_outputs": {"json_object": true})", "structured_outputs", {}, {}, true},
  };
  for (const Form& f : forms) {
    SCOPED_TRACE(f.fields);
    CompletionRequest r;
    const auto body = nlohmann::json::parse(std::string(R"({"prompt": "x", )") + f.fields + "}");
    ASSERT_FALSE(parse_completion_request(body, ApiLimits{}, &r).has_value());
    ASSERT_TRUE(r.structured_output.has_value());
    EXPECT_EQ(r.structured_output->field, f.field);
    if (f.any_object) {
      EXPECT_EQ(r.structured_output->pattern, grammar::json_object_regex());
      continue;
    }
    auto automaton = grammar::RegexAutomaton::compile(r.structured_output->pattern);
    ASSERT_TRUE(automaton.ok()) << automaton.status().message();
    for (const std::string& m : f.matching) EXPECT_TRUE((*automaton)->matches(m)) << m;
    for (const std::string& m : f.not_matching) EXPECT_FALSE((*automaton)->matches(m)) << m;
  }
  CompletionRequest none;
  ASSERT_FALSE(
      parse_completion_request(
          nlohmann::json::parse(
              R"({"prompt": "x", "response_format": {"type": "text"}, "guided_json": null})"),
          ApiLimits{}, &none)
          .has_value());
  EXPECT_FALSE(none.structured_output.has_value());
}

// A schema's properties come in the order the client wrote them when the body is read with
// its key order (what the server does); nlohmann::json alone sorts them.
TEST(StructuredOutputRequestTest, PropertiesKeepTheWrittenOrder) {
  const std::string body =
      R"({"guided_json": {"type": "object", "properties": {"z": {"type": "integer"},
          "a": {"type": "integer"}}, "required": ["z", "a"]}})";
  std::optional<StructuredOutputRequest> ordered, sorted;
  ASSERT_FALSE(parse_structured_output(nlohmann::ordered_json::parse(body), &ordered));
  ASSERT_FALSE(parse_structured_output(nlohmann::json::parse(body), &sorted));
  auto in_order = grammar::RegexAutomaton::compile(ordered->pattern);
  auto alphabetical = grammar::RegexAutomaton::compile(sorted->pattern);
  ASSERT_TRUE(in_order.ok() && alphabetical.ok());
  EXPECT_TRUE((*in_order)->matches(R"({"z":1,"a":2})"));
  EXPECT_FALSE((*in_order)->matches(R"({"a":2,"z":1})"));
  EXPECT_TRUE((*alphabetical)->matches(R"({"a":2,"z":1})"));
}

// The ordered copy of chosen members: their keys as sent, other members not kept, and given up
// past the key bounds (the server's structured outputs read the body again through it; a
// whole-body ordered parse of 60,000 keys took 4.9 s of a worker).
TEST(OpenAiProtocolTest, OrderedBodyMembersKeepOrderWithinBounds) {
  constexpr std::string_view kKeep[] = {"guided_json"};
  const auto parts = ordered_body_members(
      R"({"prompt": "x", "guided_json": {"z": 1, "a": 2}, "other": {"q": 0}})", kKeep);
  ASSERT_TRUE(parts.has_value());
  EXPECT_FALSE(parts->contains("other"));
  EXPECT_FALSE(parts->contains("prompt"));
  EXPECT_EQ((*parts)["guided_json"].dump(), R"({"z":1,"a":2})");

  nlohmann::json many = nlohmann::json::object();
  for (int i = 0; i < 600; ++i) many["k" + std::to_string(i)] = i;
  nlohmann::json body = {{"guided_json", many}};
  EXPECT_FALSE(ordered_body_members(body.dump(), kKeep).has_value());  // over 512 keys
  body = {{"other", many}, {"guided_json", {{"a", 1}}}};               // not kept: not counted
  EXPECT_TRUE(ordered_body_members(body.dump(), kKeep).has_value());
  EXPECT_FALSE(ordered_body_members("[1, 2]", kKeep).has_value());
}

}  // namespace
}  // namespace peerserve
