// The wire form of requests and outputs between ranks: every field survives a round trip,
// and truncated or corrupted messages are errors, never crashes or huge allocations.
#include "runtime/request_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace peerserve {
namespace {

EngineRequest full_request() {
  EngineRequest r;
  r.prompt_tokens = {5, 0, 99, 12345};
  SamplingParams& s = r.params.sampling;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.top_p = 0.9f;
  s.min_p = 0.05f;
  s.presence_penalty = 0.5f;
  s.frequency_penalty = -0.25f;
  s.repetition_penalty = 1.1f;
  s.seed = 1234567890123ULL;
  s.want_logprobs = true;
  s.top_logprobs = 3;
  s.min_tokens = 2;
  s.suppressed_until_min_tokens = {7, 8};
  s.forced_tokens = {3, 1, 4};
  s.allowed_token_ids = {1, 3, 4, 99};
  s.logit_bias = {{7, 2.5f}, {9, -100.0f}};
  r.params.max_tokens = 77;
  r.params.default_max_tokens = 16;
  r.params.stop_strings = {"END", "\n\n", std::string("a\0b", 3)};
  r.params.include_stop_str_in_output = true;
  r.params.stop_token_ids = {3, 4};
  r.params.ignore_eos = true;
  r.params.n = 3;
  r.params.skip_special_tokens = false;
  r.params.prompt_logprobs = 5;
  r.params.structured_output_pattern = "\\{\"a\":[0-9]+\\}";
  r.params.sampling.bad_words_ids = {{5}, {6, 7, 8}};
  r.prefill_hint = "127.0.0.1:8101";
  r.cache_salt = "tenant-a";
  r.kv_push = KvPushTarget{
      .endpoint = "10.0.0.7:9100", .transfer = "handoff-42", .first_block = 3, .tail = true};
  return r;
}

RequestOutput full_output() {
  RequestOutput o;
  o.request_id = 0xfeedfacecafeULL;
  ChoiceDelta a;
  a.index = 2;
  a.token_ids = {10, 11};
  a.text = "hé";
  a.logprobs = {{10, -0.5f, {{10, -0.5f}, {12, -1.5f}}}, {11, -0.25f, {}}};
  a.finish_reason = FinishReason::kStop;
  a.stop_string = "END";
  a.stop_token = 4;
  ChoiceDelta b;
  b.index = 0;
  b.token_ids = {1};
  o.choices = {a, b};
  o.prompt_logprobs = {{99, -3.25f, 7, {{5, -0.125f}}}, {12345, -0.5f, 1, {}}};
  o.finished = true;
  o.usage = {17, 3, 16};
  o.error = resource_exhausted("the waiting queue is full");
  return o;
}

std::vector<std::byte> encoded_request() {
  std::vector<std::byte> bytes;
  ByteWriter out(&bytes);
  encode_request(full_request(), out);
  return bytes;
}

std::vector<std::byte> encoded_output() {
  std::vector<std::byte> bytes;
  ByteWriter out(&bytes);
  encode_output(full_output(), out);
  return bytes;
}

TEST(RequestCodecTest, RequestRoundTripsEveryField) {
  const auto bytes = encoded_request();
  ByteReader in(bytes);
  auto decoded = decode_request(in);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_TRUE(in.at_end());
  const EngineRequest want = full_request();
  EXPECT_EQ(decoded->prompt_tokens, want.prompt_tokens);
  const SamplingParams& s = decoded->params.sampling;
  EXPECT_EQ(s.temperature, 0.7f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.presence_penalty, 0.5f);
  EXPECT_EQ(s.frequency_penalty, -0.25f);
  EXPECT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_EQ(s.seed, want.params.sampling.seed);
  EXPECT_TRUE(s.want_logprobs);
  EXPECT_EQ(s.top_logprobs, 3);
  EXPECT_EQ(s.min_tokens, 2);
  EXPECT_EQ(s.suppressed_until_min_tokens, want.params.sampling.suppressed_until_min_tokens);
  EXPECT_EQ(s.forced_tokens, want.params.sampling.forced_tokens);
  EXPECT_EQ(s.allowed_token_ids, want.params.sampling.allowed_token_ids);
  EXPECT_EQ(s.logit_bias, want.params.sampling.logit_bias);
  EXPECT_EQ(decoded->params.max_tokens, 77);
  EXPECT_EQ(decoded->params.default_max_tokens, 16);
  EXPECT_EQ(decoded->params.stop_strings, want.params.stop_strings);
  EXPECT_TRUE(decoded->params.include_stop_str_in_output);
  EXPECT_EQ(decoded->params.stop_token_ids, want.params.stop_token_ids);
  EXPECT_TRUE(decoded->params.ignore_eos);
  EXPECT_EQ(decoded->params.n, 3);
  EXPECT_FALSE(decoded->params.skip_special_tokens);
  EXPECT_EQ(decoded->params.prompt_logprobs, 5);
  EXPECT_EQ(decoded->params.structured_output_pattern, "\\{\"a\":[0-9]+\\}");
  EXPECT_EQ(decoded->params.sampling.bad_words_ids,
            (std::vector<std::vector<TokenId>>{{5}, {6, 7, 8}}));
  // The compiled constraint does not travel: the receiving rank compiles the pattern.
  EXPECT_EQ(decoded->params.sampling.constraint, nullptr);
  EXPECT_EQ(decoded->prefill_hint, "127.0.0.1:8101");
  EXPECT_EQ(decoded->cache_salt, "tenant-a");
  // A prefill instance's request handed to another rank still pushes its KV.
  ASSERT_TRUE(decoded->kv_push.has_value());
  EXPECT_EQ(decoded->kv_push->endpoint, "10.0.0.7:9100");
  EXPECT_EQ(decoded->kv_push->transfer, "handoff-42");
  EXPECT_EQ(decoded->kv_push->first_block, 3);
  EXPECT_TRUE(decoded->kv_push->tail);

  // Unset optionals stay unset.
  EngineRequest plain;
  plain.prompt_tokens = {1};
  std::vector<std::byte> plain_bytes;
  ByteWriter out(&plain_bytes);
  encode_request(plain, out);
  ByteReader plain_in(plain_bytes);
  auto plain_decoded = decode_request(plain_in);
  ASSERT_TRUE(plain_decoded.ok());
  EXPECT_FALSE(plain_decoded->params.max_tokens.has_value());
  EXPECT_FALSE(plain_decoded->params.sampling.seed.has_value());
  EXPECT_FALSE(plain_decoded->params.prompt_logprobs.has_value());
  EXPECT_TRUE(plain_decoded->params.structured_output_pattern.empty());
  EXPECT_FALSE(plain_decoded->kv_push.has_value());
}

TEST(RequestCodecTest, OutputRoundTripsEveryField) {
  const auto bytes = encoded_output();
  ByteReader in(bytes);
  auto decoded = decode_output(in);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_TRUE(in.at_end());
  const RequestOutput want = full_output();
  EXPECT_EQ(decoded->request_id, want.request_id);
  ASSERT_EQ(decoded->choices.size(), 2u);
  const ChoiceDelta& a = decoded->choices[0];
  EXPECT_EQ(a.index, 2);
  EXPECT_EQ(a.token_ids, want.choices[0].token_ids);
  EXPECT_EQ(a.text, "hé");
  ASSERT_EQ(a.logprobs.size(), 2u);
  EXPECT_EQ(a.logprobs[0].token, 10);
  EXPECT_EQ(a.logprobs[0].logprob, -0.5f);
  ASSERT_EQ(a.logprobs[0].top_logprobs.size(), 2u);
  EXPECT_EQ(a.logprobs[0].top_logprobs[1].token, 12);
  EXPECT_EQ(a.logprobs[0].top_logprobs[1].logprob, -1.5f);
  EXPECT_TRUE(a.logprobs[1].top_logprobs.empty());
  EXPECT_EQ(a.finish_reason, FinishReason::kStop);
  EXPECT_EQ(a.stop_string, "END");
  EXPECT_EQ(a.stop_token, 4);
  const ChoiceDelta& b = decoded->choices[1];
  EXPECT_FALSE(b.finish_reason.has_value());
  EXPECT_FALSE(b.stop_string.has_value());
  EXPECT_FALSE(b.stop_token.has_value());
  ASSERT_EQ(decoded->prompt_logprobs.size(), 2u);
  EXPECT_EQ(decoded->prompt_logprobs[0].token, 99);
  EXPECT_EQ(decoded->prompt_logprobs[0].logprob, -3.25f);
  EXPECT_EQ(decoded->prompt_logprobs[0].rank, 7);
  ASSERT_EQ(decoded->prompt_logprobs[0].top_logprobs.size(), 1u);
  EXPECT_EQ(decoded->prompt_logprobs[0].top_logprobs[0].token, 5);
  EXPECT_EQ(decoded->prompt_logprobs[0].top_logprobs[0].logprob, -0.125f);
  EXPECT_EQ(decoded->prompt_logprobs[1].token, 12345);
  EXPECT_EQ(decoded->prompt_logprobs[1].rank, 1);
  EXPECT_TRUE(decoded->prompt_logprobs[1].top_logprobs.empty());
  EXPECT_TRUE(decoded->finished);
  EXPECT_EQ(decoded->usage.prompt_tokens, 17);
  EXPECT_EQ(decoded->usage.completion_tokens, 3);
  EXPECT_EQ(decoded->usage.cached_prompt_tokens, 16);
  EXPECT_EQ(decoded->error.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(decoded->error.message(), "the waiting queue is full");
}

TEST(RequestCodecTest, EveryTruncationIsAnError) {
  for (const auto& bytes : {encoded_request(), encoded_output()}) {
    const bool is_request = bytes == encoded_request();
    for (size_t n = 0; n < bytes.size(); ++n) {
      ByteReader in(std::span<const std::byte>(bytes).first(n));
      const Status s = is_request ? decode_request(in).status() : decode_output(in).status();
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "prefix of " << n << " bytes";
    }
  }
}

TEST(RequestCodecTest, CorruptBytesNeverCrash) {
  // Random byte changes (lengths among them) decode or fail cleanly; ASan/UBSan runs check
  // that nothing reads out of bounds or allocates a forged length.
  std::mt19937 rng(7);
  int failures = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    auto bytes = trial % 2 == 0 ? encoded_request() : encoded_output();
    const int changes = 1 + static_cast<int>(rng() % 4);
    for (int c = 0; c < changes; ++c) {
      bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xff);
    }
    ByteReader in(bytes);
    const Status s = trial % 2 == 0 ? decode_request(in).status() : decode_output(in).status();
    if (!s.ok()) {
      ++failures;
      EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    }
  }
  EXPECT_GT(failures, 0);  // the corruption did hit lengths and enums
}

TEST(RequestCodecTest, ForgedHugeLengthsAreRefusedBeforeAllocating) {
  std::vector<std::byte> bytes;
  ByteWriter out(&bytes);
  out.put<uint64_t>(uint64_t{1} << 60);  // prompt token count
  ByteReader in(bytes);
  EXPECT_EQ(decode_request(in).status().code(), StatusCode::kDataLoss);
  std::vector<std::byte> out_bytes;
  ByteWriter out2(&out_bytes);
  out2.put<uint64_t>(1);
  out2.put<uint64_t>(~uint64_t{0});  // choice count
  ByteReader in2(out_bytes);
  EXPECT_EQ(decode_output(in2).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace peerserve
