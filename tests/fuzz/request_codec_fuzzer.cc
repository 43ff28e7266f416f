// libFuzzer target: arbitrary bytes as the data-parallel front end's step mail (an engine
// request or an engine output, runtime/request_codec.h). The first byte picks the decoder.
// Traps when an accepted message does not survive encode -> decode unchanged: the decoder
// must read exactly what the encoder writes, field for field.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "base/byte_io.h"
#include "runtime/request_codec.h"

namespace {

using peerserve::ByteReader;
using peerserve::ByteWriter;

bool same_float(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

bool same(const peerserve::SamplingParams& a, const peerserve::SamplingParams& b) {
  return same_float(a.temperature, b.temperature) && a.top_k == b.top_k &&
         same_float(a.top_p, b.top_p) && same_float(a.min_p, b.min_p) &&
         same_float(a.presence_penalty, b.presence_penalty) &&
         same_float(a.frequency_penalty, b.frequency_penalty) &&
         same_float(a.repetition_penalty, b.repetition_penalty) && a.seed == b.seed &&
         a.want_logprobs == b.want_logprobs && a.top_logprobs == b.top_logprobs &&
         a.min_tokens == b.min_tokens &&
         a.suppressed_until_min_tokens == b.suppressed_until_min_tokens &&
         a.forced_tokens == b.forced_tokens && a.allowed_token_ids == b.allowed_token_ids;
}

bool same(const peerserve::EngineRequest& a, const peerserve::EngineRequest& b) {
  const auto &p = a.params, &q = b.params;
  return a.prompt_tokens == b.prompt_tokens && same(p.sampling, q.sampling) &&
         p.max_tokens == q.max_tokens && p.default_max_tokens == q.default_max_tokens &&
         p.stop_strings == q.stop_strings &&
         p.include_stop_str_in_output == q.include_stop_str_in_output &&
         p.stop_token_ids == q.stop_token_ids && p.ignore_eos == q.ignore_eos && p.n == q.n &&
         p.skip_special_tokens == q.skip_special_tokens && a.prefill_hint == b.prefill_hint &&
         a.cache_salt == b.cache_salt && p.prompt_logprobs == q.prompt_logprobs;
}

bool same(const std::vector<peerserve::TokenLogprob>& a,
          const std::vector<peerserve::TokenLogprob>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].token != b[k].token || !same_float(a[k].logprob, b[k].logprob)) return false;
  }
  return true;
}

bool same(const peerserve::RequestOutput& a, const peerserve::RequestOutput& b) {
  if (a.request_id != b.request_id || a.choices.size() != b.choices.size() ||
      a.finished != b.finished || a.usage.prompt_tokens != b.usage.prompt_tokens ||
      a.usage.completion_tokens != b.usage.completion_tokens ||
      a.usage.cached_prompt_tokens != b.usage.cached_prompt_tokens ||
      a.error.code() != b.error.code() || a.error.message() != b.error.message()) {
    return false;
  }
  for (size_t i = 0; i < a.choices.size(); ++i) {
    const auto &c = a.choices[i], &d = b.choices[i];
    if (c.index != d.index || c.token_ids != d.token_ids || c.text != d.text ||
        c.logprobs.size() != d.logprobs.size() || c.finish_reason != d.finish_reason ||
        c.stop_string != d.stop_string || c.stop_token != d.stop_token) {
      return false;
    }
    for (size_t t = 0; t < c.logprobs.size(); ++t) {
      const auto &x = c.logprobs[t], &y = d.logprobs[t];
      if (x.token != y.token || !same_float(x.logprob, y.logprob) ||
          !same(x.top_logprobs, y.top_logprobs)) {
        return false;
      }
    }
  }
  if (a.prompt_logprobs.size() != b.prompt_logprobs.size()) return false;
  for (size_t t = 0; t < a.prompt_logprobs.size(); ++t) {
    const auto &x = a.prompt_logprobs[t], &y = b.prompt_logprobs[t];
    if (x.token != y.token || !same_float(x.logprob, y.logprob) || x.rank != y.rank ||
        !same(x.top_logprobs, y.top_logprobs)) {
      return false;
    }
  }
  return true;
}

template <typename T, typename Decode, typename Encode>
void round_trip(std::span<const std::byte> bytes, Decode decode, Encode encode) {
  ByteReader in(bytes);
  auto first = decode(in);
  if (!first.ok()) return;
  std::vector<std::byte> again;
  ByteWriter out(&again);
  encode(*first, out);
  ByteReader in2(again);
  auto second = decode(in2);
  if (!second.ok() || !in2.at_end() || !same(*first, *second)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  if (data[0] & 1) {
    round_trip<peerserve::RequestOutput>(
        bytes, [](ByteReader& in) { return peerserve::decode_output(in); },
        [](const peerserve::RequestOutput& o, ByteWriter& out) {
          peerserve::encode_output(o, out);
        });
  } else {
    round_trip<peerserve::EngineRequest>(
        bytes, [](ByteReader& in) { return peerserve::decode_request(in); },
        [](const peerserve::EngineRequest& r, ByteWriter& out) {
          peerserve::encode_request(r, out);
        });
  }
  return 0;
}
