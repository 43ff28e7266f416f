#include "runtime/request_codec.h"

#include <span>
#include <string>

namespace peerserve {
namespace {

// Sanity bounds for counts inside one message (the front end never sends more).
constexpr uint64_t kMaxChoices = 1 << 16;

template <typename T>
void put_optional(ByteWriter& out, const std::optional<T>& value) {
  out.put_bool(value.has_value());
  if (value) out.put<T>(*value);
}

template <typename T>
std::optional<T> get_optional(ByteReader& in) {
  if (!in.get_bool()) return std::nullopt;
  return in.get<T>();
}

void encode_sampling(const SamplingParams& s, ByteWriter& out) {
  out.put<float>(s.temperature);
  out.put<int32_t>(s.top_k);
  out.put<float>(s.top_p);
  out.put<float>(s.min_p);
  out.put<float>(s.presence_penalty);
  out.put<float>(s.frequency_penalty);
  out.put<float>(s.repetition_penalty);
  put_optional<uint64_t>(out, s.seed);
  out.put_bool(s.want_logprobs);
  out.put<int32_t>(s.top_logprobs);
  out.put<int32_t>(s.min_tokens);
  out.put_array<TokenId>(s.suppressed_until_min_tokens);
  out.put_array<TokenId>(s.forced_tokens);
  out.put_array<TokenId>(s.allowed_token_ids);
  out.put<uint64_t>(s.logit_bias.size());
  for (const auto& [id, bias] : s.logit_bias) {
    out.put<TokenId>(id);
    out.put<float>(bias);
  }
  out.put<uint64_t>(s.bad_words_ids.size());
  for (const std::vector<TokenId>& word : s.bad_words_ids) out.put_array<TokenId>(word);
}

SamplingParams decode_sampling(ByteReader& in) {
  SamplingParams s;
  s.temperature = in.get<float>();
  s.top_k = in.get<int32_t>();
  s.top_p = in.get<float>();
  s.min_p = in.get<float>();
  s.presence_penalty = in.get<float>();
  s.frequency_penalty = in.get<float>();
  s.repetition_penalty = in.get<float>();
  s.seed = get_optional<uint64_t>(in);
  s.want_logprobs = in.get_bool();
  s.top_logprobs = in.get<int32_t>();
  s.min_tokens = in.get<int32_t>();
  s.suppressed_until_min_tokens = in.get_array<TokenId>();
  s.forced_tokens = in.get_array<TokenId>();
  s.allowed_token_ids = in.get_array<TokenId>();
  const uint64_t biases = in.get_count(sizeof(TokenId) + sizeof(float));
  s.logit_bias.reserve(biases);
  for (uint64_t i = 0; i < biases && in.ok(); ++i) {
    const TokenId id = in.get<TokenId>();
    s.logit_bias.emplace_back(id, in.get<float>());
  }
  const uint64_t bad_words = in.get_count(sizeof(uint64_t));
  for (uint64_t i = 0; i < bad_words && in.ok(); ++i) {
    s.bad_words_ids.push_back(in.get_array<TokenId>());
  }
  return s;
}

void encode_top_logprobs(const std::vector<TokenLogprob>& top, ByteWriter& out) {
  out.put<uint64_t>(top.size());
  for (const TokenLogprob& t : top) {
    out.put<TokenId>(t.token);
    out.put<float>(t.logprob);
  }
}

std::vector<TokenLogprob> decode_top_logprobs(ByteReader& in) {
  std::vector<TokenLogprob> top;
  const uint64_t count = in.get_count(sizeof(TokenId) + sizeof(float));
  for (uint64_t k = 0; k < count && in.ok(); ++k) {
    TokenLogprob t;
    t.token = in.get<TokenId>();
    t.logprob = in.get<float>();
    top.push_back(t);
  }
  return top;
}

void encode_status(const Status& status, ByteWriter& out) {
  out.put<int32_t>(static_cast<int32_t>(status.code()));
  out.put_string(status.message());
}

Status decode_status(ByteReader& in, bool* valid) {
  const auto code = in.get<int32_t>();
  std::string message = in.get_string();
  if (code < static_cast<int32_t>(StatusCode::kOk) ||
      code > static_cast<int32_t>(StatusCode::kInternal)) {
    *valid = false;
    return ok_status();
  }
  if (code == 0) return ok_status();
  return Status(static_cast<StatusCode>(code), std::move(message));
}

}  // namespace

void encode_request(const EngineRequest& request, ByteWriter& out) {
  out.put_array<TokenId>(request.prompt_tokens);
  const GenerationParams& p = request.params;
  encode_sampling(p.sampling, out);
  put_optional<int32_t>(out, p.max_tokens);
  put_optional<int32_t>(out, p.default_max_tokens);
  out.put<uint64_t>(p.stop_strings.size());
  for (const std::string& s : p.stop_strings) out.put_string(s);
  out.put_bool(p.include_stop_str_in_output);
  out.put_array<TokenId>(p.stop_token_ids);
  out.put_bool(p.ignore_eos);
  out.put<int32_t>(p.n);
  out.put_bool(p.skip_special_tokens);
  put_optional<int32_t>(out, p.prompt_logprobs);
  out.put_string(p.structured_output_pattern);
  out.put_string(request.prefill_hint);
  out.put_string(request.cache_salt);
  // A prefill instance's hand-off target travels too: a request rank 0 hands to another
  // rank must still push its KV to the decode instance waiting for it.
  out.put_bool(request.kv_push.has_value());
  if (request.kv_push) {
    out.put_string(request.kv_push->endpoint);
    out.put_string(request.kv_push->transfer);
    out.put<int64_t>(request.kv_push->first_block);
    out.put_bool(request.kv_push->tail);
  }
}

Result<EngineRequest> decode_request(ByteReader& in) {
  EngineRequest request;
  request.prompt_tokens = in.get_array<TokenId>();
  GenerationParams& p = request.params;
  p.sampling = decode_sampling(in);
  p.max_tokens = get_optional<int32_t>(in);
  p.default_max_tokens = get_optional<int32_t>(in);
  const uint64_t num_stop = in.get_count(sizeof(uint64_t));
  for (uint64_t i = 0; i < num_stop && in.ok(); ++i) p.stop_strings.push_back(in.get_string());
  p.include_stop_str_in_output = in.get_bool();
  p.stop_token_ids = in.get_array<TokenId>();
  p.ignore_eos = in.get_bool();
  p.n = in.get<int32_t>();
  p.skip_special_tokens = in.get_bool();
  p.prompt_logprobs = get_optional<int32_t>(in);
  p.structured_output_pattern = in.get_string();
  request.prefill_hint = in.get_string();
  request.cache_salt = in.get_string();
  if (in.get_bool()) {
    KvPushTarget& push = request.kv_push.emplace();
    push.endpoint = in.get_string();
    push.transfer = in.get_string();
    push.first_block = in.get<int64_t>();
    push.tail = in.get_bool();
    if (in.ok() && push.first_block < 0) {
      return data_loss("engine request message: kv_push.first_block = " +
                       std::to_string(push.first_block));
    }
  }
  if (!in.ok()) return data_loss("engine request message is truncated or corrupt");
  return request;
}

void encode_output(const RequestOutput& output, ByteWriter& out) {
  out.put<uint64_t>(output.request_id);
  out.put<uint64_t>(output.choices.size());
  for (const ChoiceDelta& c : output.choices) {
    out.put<int32_t>(c.index);
    out.put_array<TokenId>(c.token_ids);
    out.put_string(c.text);
    out.put<uint64_t>(c.logprobs.size());
    for (const SampledToken& t : c.logprobs) {
      out.put<TokenId>(t.token);
      out.put<float>(t.logprob);
      encode_top_logprobs(t.top_logprobs, out);
    }
    out.put_bool(c.finish_reason.has_value());
    if (c.finish_reason) out.put<int32_t>(static_cast<int32_t>(*c.finish_reason));
    out.put_bool(c.stop_string.has_value());
    if (c.stop_string) out.put_string(*c.stop_string);
    put_optional<TokenId>(out, c.stop_token);
  }
  out.put<uint64_t>(output.prompt_logprobs.size());
  for (const PromptTokenLogprob& t : output.prompt_logprobs) {
    out.put<TokenId>(t.token);
    out.put<float>(t.logprob);
    out.put<int32_t>(t.rank);
    encode_top_logprobs(t.top_logprobs, out);
  }
  out.put_bool(output.finished);
  out.put<int64_t>(output.usage.prompt_tokens);
  out.put<int64_t>(output.usage.completion_tokens);
  out.put<int64_t>(output.usage.cached_prompt_tokens);
  encode_status(output.error, out);
}

Result<RequestOutput> decode_output(ByteReader& in) {
  RequestOutput output;
  bool valid = true;
  output.request_id = in.get<uint64_t>();
  const uint64_t num_choices = in.get_count(sizeof(int32_t));
  if (num_choices > kMaxChoices) valid = false;
  for (uint64_t i = 0; i < num_choices && in.ok() && valid; ++i) {
    ChoiceDelta c;
    c.index = in.get<int32_t>();
    c.token_ids = in.get_array<TokenId>();
    c.text = in.get_string();
    const uint64_t num_logprobs = in.get_count(sizeof(TokenId) + sizeof(float));
    for (uint64_t t = 0; t < num_logprobs && in.ok(); ++t) {
      SampledToken token;
      token.token = in.get<TokenId>();
      token.logprob = in.get<float>();
      token.top_logprobs = decode_top_logprobs(in);
      c.logprobs.push_back(std::move(token));
    }
    if (in.get_bool()) {
      const auto reason = in.get<int32_t>();
      if (reason < static_cast<int32_t>(FinishReason::kStop) ||
          reason > static_cast<int32_t>(FinishReason::kError)) {
        valid = false;
      }
      c.finish_reason = static_cast<FinishReason>(reason);
    }
    if (in.get_bool()) c.stop_string = in.get_string();
    c.stop_token = get_optional<TokenId>(in);
    output.choices.push_back(std::move(c));
  }
  const uint64_t num_prompt_logprobs =
      in.get_count(sizeof(TokenId) + sizeof(float) + sizeof(int32_t) + sizeof(uint64_t));
  for (uint64_t t = 0; t < num_prompt_logprobs && in.ok() && valid; ++t) {
    PromptTokenLogprob token;
    token.token = in.get<TokenId>();
    token.logprob = in.get<float>();
    token.rank = in.get<int32_t>();
    token.top_logprobs = decode_top_logprobs(in);
    output.prompt_logprobs.push_back(std::move(token));
  }
  output.finished = in.get_bool();
  output.usage.prompt_tokens = in.get<int64_t>();
  output.usage.completion_tokens = in.get<int64_t>();
  output.usage.cached_prompt_tokens = in.get<int64_t>();
  output.error = decode_status(in, &valid);
  if (!in.ok() || !valid) return data_loss("engine output message is truncated or corrupt");
  return output;
}

}  // namespace peerserve
