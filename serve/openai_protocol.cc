#include "serve/openai_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "kv/kv_namespace.h"
#include "tokenizer/internal/utf8.h"

namespace peerserve {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

std::string brief(const json& value) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string type_name(const json& value) {
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_integer() || value.is_number_unsigned()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

std::string format_number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

ApiError bad_field(const std::string& name, const std::string& message) {
  ApiError e;
  e.status = 400;
  e.message = message;
  e.param = name;
  e.code = "invalid_value";
  return e;
}

ApiError unsupported(const std::string& name, const std::string& message) {
  ApiError e = bad_field(name, message);
  e.code = "unsupported_parameter";
  return e;
}

// Typed, range-checked access to the fields of a request object. JSON null counts as
// absent. The first error sticks; later reads then return nothing.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  std::optional<ApiError> error;

  const json* get(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) {
    const json* v = get(name);
    if (error || v == nullptr) return std::nullopt;
    if (!v->is_number()) {
      fail(name, "'" + std::string(name) + "' must be a number, got " + type_name(*v));
      return std::nullopt;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
      fail(name, "'" + std::string(name) + "' must be " + (lo_open ? "> " : ">= ") +
                     format_number(lo) + " and <= " + format_number(hi) + ", got " + brief(*v));
      return std::nullopt;
    }
    return x;
  }

  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (error || v == nullptr) return std::nullopt;
    return as_integer(*v, name, lo, hi);
  }

  std::optional<int64_t> as_integer(const json& v, const std::string& name, int64_t lo,
                                    int64_t hi) {
    int64_t x = 0;
    // is_number_integer() is true for unsigned values too: test unsigned first, or 2^63
    // would read as a negative number.
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        // Out of every range here (a seed of 2^63 and one of 2^64 - 1 were both read as
        // 2^63 - 1, the same samples).
        fail(name, "'" + name + "' must be between " + std::to_string(lo) + " and " +
                       std::to_string(hi) + ", got " + brief(v));
        return std::nullopt;
      }
      x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9e15) {
      x = static_cast<int64_t>(v.get<double>());
    } else {
      fail(name, "'" + name + "' must be an integer, got " + type_name(v) +
                     (v.is_number() ? " " + brief(v) : ""));
      return std::nullopt;
    }
    if (x < lo || x > hi) {
      fail(name, "'" + name + "' must be between " + std::to_string(lo) + " and " +
                     std::to_string(hi) + ", got " + brief(v));
      return std::nullopt;
    }
    return x;
  }

  std::optional<bool> boolean(const char* name) {
    const json* v = get(name);
    if (error || v == nullptr) return std::nullopt;
    if (!v->is_boolean()) {
      fail(name, "'" + std::string(name) + "' must be a boolean, got " + type_name(*v));
      return std::nullopt;
    }
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) {
    const json* v = get(name);
    if (error || v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      fail(name, "'" + std::string(name) + "' must be a string, got " + type_name(*v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

  void fail(const std::string& name, const std::string& message) {
    if (!error) error = bad_field(name, message);
  }
  void fail_unsupported(const std::string& name, const std::string& message) {
    if (!error) error = unsupported(name, message);
  }
  const json& body() const { return body_; }

 private:
  const json& body_;
};

// A field that is an array of token ids (each 0 .. 2^31 - 1), appended to *ids.
void token_id_field(Fields& f, const char* name, bool allow_empty, std::vector<TokenId>* ids) {
  const json* v = f.get(name);
  if (v == nullptr || f.error) return;
  if (!v->is_array() || (!allow_empty && v->empty())) {
    f.fail(name, std::string("'") + name + "' must be " + (allow_empty ? "an" : "a non-empty") +
                     " array of token ids, got " + type_name(*v));
    return;
  }
  for (const json& item : *v) {
    if (auto id = f.as_integer(item, name, 0, std::numeric_limits<int32_t>::max())) {
      ids->push_back(static_cast<TokenId>(*id));
    }
  }
}

void parse_common(Fields& f, const ApiLimits& limits, bool chat, CommonRequestFields* out) {
  out->model = f.string("model");
  if (auto hint = f.string("peerserve_prefill")) {
    if (hint->empty() || hint->size() > 300) {
      f.fail("peerserve_prefill", "'peerserve_prefill' must be a HOST:PORT of 1 to 300 characters");
    } else {
      out->prefill_hint = std::move(*hint);
    }
  }
  if (auto salt = f.string("cache_salt")) {
    // vLLM refuses an empty salt too: it would silently share the cache.
    if (salt->empty() || salt->size() > kMaxCacheSaltBytes) {
      f.fail("cache_salt", "'cache_salt' must be a string of 1 to " +
                               std::to_string(kMaxCacheSaltBytes) + " bytes");
    } else {
      out->cache_salt = std::move(*salt);
    }
  }
  GenerationParams& p = out->params;
  SamplingParams& s = p.sampling;
  limits.sampling_defaults.apply_to(s);
  if (auto v = f.number("temperature", 0.0, 2.0)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = static_cast<float>(*v);
  if (auto v = f.integer("top_k", -1, std::numeric_limits<int32_t>::max())) {
    s.top_k = *v <= 0 ? 0 : static_cast<int32_t>(*v);  // -1 and 0 mean off (vLLM)
  }
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) {
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = f.number("repetition_penalty", 0.0, 10.0, /*lo_open=*/true)) {
    s.repetition_penalty = static_cast<float>(*v);
  }
  // -1 is "no seed", as in vLLM (a seed drawn per request).
  if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max());
      v && *v != -1) {
    s.seed = static_cast<uint64_t>(*v);
  }
  const int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens;
  if (chat) max_tokens = f.integer("max_completion_tokens", 1, kMaxTokens);
  // 0 only for completions with echo (the prompt alone; parse_completion_request checks).
  if (!max_tokens) max_tokens = f.integer("max_tokens", chat ? 1 : 0, kMaxTokens);
  if (max_tokens) p.max_tokens = static_cast<int32_t>(*max_tokens);
  // Completions default to 16 tokens within the context (OpenAI's legacy API and vLLM); chat
  // runs to the end of the context, as both do.
  if (!chat) p.default_max_tokens = static_cast<int32_t>(kDefaultCompletionMaxTokens);
  if (auto v = f.integer("min_tokens", 0, kMaxTokens)) {
    if (max_tokens && *v > *max_tokens) {
      f.fail("min_tokens", "'min_tokens' (" + std::to_string(*v) +
                               ") must not be larger than the maximum number of tokens (" +
                               std::to_string(*max_tokens) + ")");
    }
    s.min_tokens = static_cast<int32_t>(*v);
  }
  // Accepted and not used for anything (OpenAI: an end-user id for abuse monitoring). It is
  // never a metrics label: that would let clients create unbounded series.
  (void)f.string("user");
  // vLLM's bad_words: the server tokenizes them (serve/bad_words.h).
  if (const json* bad_words = f.get("bad_words"); bad_words && !f.error) {
    if (!bad_words->is_array() || static_cast<int64_t>(bad_words->size()) > kMaxBadWords) {
      f.fail("bad_words", "'bad_words' must be an array of at most " +
                              std::to_string(kMaxBadWords) + " strings");
    } else {
      for (const json& word : *bad_words) {
        if (!word.is_string() || word.get<std::string>().empty() ||
            word.get<std::string>().size() > kMaxBadWordBytes) {
          f.fail("bad_words", "'bad_words' entries must be strings of 1 to " +
                                  std::to_string(kMaxBadWordBytes) + " bytes");
          break;
        }
        out->bad_words.push_back(word.get<std::string>());
      }
    }
  }
  // vLLM's extensions that would change the output or what comes back, and are not built:
  // refused, so that a client moving from vLLM is not handed unconstrained text in silence.
  // Each is accepted at its no-op value (null, false, or the value named here).
  struct Extension {
    const char* name;
    json neutral;  // also accepted; null always is
  };
  const Extension kUnbuiltExtensions[] = {
      {"logits_processors", nullptr},
      {"use_beam_search", false},
      {"length_penalty", 1.0},
      {"logprob_token_ids", nullptr},
      {"repetition_detection", nullptr},
      {"thinking_token_budget", nullptr},
      {"stream_interval", 1},
  };
  const Extension kUnbuiltChatExtensions[] = {
      // The template adds BOS; another would come before it.
      {"add_special_tokens", false},
      {"chat_template", nullptr},
      {"documents", nullptr},
  };
  const auto refuse_unbuilt = [&](const Extension& e) {
    const json* v = f.get(e.name);
    if (v == nullptr || f.error || (!e.neutral.is_null() && *v == e.neutral)) return;
    f.fail_unsupported(
        e.name,
        std::string("'") + e.name + "' (a vLLM extension) is not supported" +
            (e.neutral.is_null() ? std::string() : "; only " + e.neutral.dump() + " is accepted"));
  };
  for (const Extension& e : kUnbuiltExtensions) refuse_unbuilt(e);
  if (!f.error) {
    if (auto e = parse_structured_output(f.body(), &out->structured_output)) {
      if (e->unsupported) {
        f.fail_unsupported(e->field, e->message);
      } else {
        f.fail(e->field, e->message);
      }
    }
  }
  if (chat) {
    for (const Extension& e : kUnbuiltChatExtensions) refuse_unbuilt(e);
  }
  if (auto v = f.integer("n", 1, limits.max_n)) p.n = static_cast<int32_t>(*v);
  if (auto v = f.integer("best_of", 1, limits.max_n); v && *v != p.n) {
    f.fail_unsupported("best_of", "'best_of' different from 'n' is not supported");
  }

  if (const json* stop = f.get("stop"); stop && !f.error) {
    auto add = [&](const json& item) {
      if (item.is_string()) {
        if (item.get<std::string>().empty()) {
          f.fail("stop", "'stop' strings must not be empty");
        } else {
          p.stop_strings.push_back(item.get<std::string>());
        }
      } else if (item.is_number()) {
        if (auto id = f.as_integer(item, "stop", 0, std::numeric_limits<int32_t>::max())) {
          p.stop_token_ids.push_back(static_cast<TokenId>(*id));
        }
      } else {
        f.fail("stop",
               "'stop' must be a string, a token id or an array of them, got " + type_name(item));
      }
    };
    if (stop->is_array()) {
      if (static_cast<int32_t>(stop->size()) > limits.max_stop_strings) {
        f.fail("stop", "'stop' has " + std::to_string(stop->size()) + " entries, at most " +
                           std::to_string(limits.max_stop_strings) + " are allowed");
      }
      for (const json& item : *stop) add(item);
    } else {
      add(*stop);
    }
  }
  token_id_field(f, "stop_token_ids", /*allow_empty=*/true, &p.stop_token_ids);
  // vLLM's allowed_token_ids: sampling keeps to these (the engine checks them against the
  // vocabulary).
  token_id_field(f, "allowed_token_ids", /*allow_empty=*/false, &s.allowed_token_ids);
  // vLLM's truncate_prompt_tokens: k keeps the prompt's last k tokens, -1 the last
  // max_model_len (the server applies it after tokenizing).
  if (auto v = f.integer("truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max())) {
    if (*v == 0) {
      f.fail("truncate_prompt_tokens",
             "'truncate_prompt_tokens' must be -1 (the context length) or at least 1, got 0");
    }
    out->truncate_prompt_tokens = static_cast<int32_t>(*v);
  }
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (auto v = f.boolean("skip_special_tokens")) p.skip_special_tokens = *v;

  if (auto v = f.boolean("stream")) out->stream = *v;
  if (auto v = f.boolean("return_token_ids")) out->return_token_ids = *v;
  if (auto v = f.boolean("return_tokens_as_token_ids")) out->tokens_as_ids = *v;
  if (auto v = f.integer("prompt_logprobs", 0, limits.max_top_logprobs)) {
    if (out->stream) {
      // As vLLM: they come with the whole answer.
      f.fail("prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true");
    }
    out->prompt_logprobs = static_cast<int32_t>(*v);
    p.prompt_logprobs = out->prompt_logprobs;
  }
  if (const json* so = f.get("stream_options"); so && !f.error) {
    if (!out->stream) {
      f.fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    } else if (!so->is_object()) {
      f.fail("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    } else {
      auto flag = [&](const char* key, bool* value) {
        auto it = so->find(key);
        if (it == so->end() || it->is_null()) return;
        if (!it->is_boolean()) {
          f.fail("stream_options", "'stream_options." + std::string(key) +
                                       "' must be a boolean, got " + type_name(*it));
        } else {
          *value = it->get<bool>();
        }
      };
      flag("include_usage", &out->include_usage);
      flag("continuous_usage_stats", &out->continuous_usage);
      // As vLLM (should_include_usage): per-chunk usage only together with include_usage.
      out->continuous_usage = out->continuous_usage && out->include_usage;
    }
  }
  // OpenAI's logit_bias: token id (a string key) -> bias, clamped to [-100, 100] as vLLM
  // does; ids outside the vocabulary are refused by the engine.
  if (const json* bias = f.get("logit_bias"); bias && !f.error && !bias->is_null()) {
    constexpr size_t kMaxEntries = 1024;
    if (!bias->is_object()) {
      f.fail("logit_bias", "'logit_bias' must be an object, got " + type_name(*bias));
    } else if (bias->size() > kMaxEntries) {
      f.fail("logit_bias", "'logit_bias' has " + std::to_string(bias->size()) +
                               " entries, at most " + std::to_string(kMaxEntries) + " are allowed");
    }
    for (auto it = bias->begin(); it != bias->end() && !f.error && bias->is_object(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 ||
          id > std::numeric_limits<int32_t>::max()) {
        f.fail("logit_bias", "'logit_bias' keys must be token ids, got " + brief(json(key)));
      } else if (!it.value().is_number() || !std::isfinite(it.value().get<double>())) {
        f.fail("logit_bias", "'logit_bias' values must be numbers, got " + type_name(it.value()) +
                                 " for token " + key);
      } else {
        const double value = std::clamp(it.value().get<double>(), -100.0, 100.0);
        s.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(value));
      }
    }
  }
}

// The UTF-16 unit of the four hex digits at text[pos..pos+4), or -1.
int32_t hex4(std::string_view text, size_t pos) {
  if (pos + 4 > text.size()) return -1;
  int32_t unit = 0;
  for (size_t k = pos; k < pos + 4; ++k) {
    const char c = text[k];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return -1;
    unit = unit * 16 + digit;
  }
  return unit;
}

bool is_high_surrogate(int32_t unit) {
  return unit >= 0xD800 && unit <= 0xDBFF;
}
bool is_low_surrogate(int32_t unit) {
  return unit >= 0xDC00 && unit <= 0xDFFF;
}

std::optional<ApiError> require_object(const json& body) {
  if (!body.is_object()) {
    ApiError e;
    e.message = "the request body must be a JSON object, got " + type_name(body);
    e.code = "invalid_type";  // as OpenAI names a value of the wrong type
    return e;
  }
  return std::nullopt;
}

}  // namespace

std::string api_error_json(const ApiError& error) {
  json e = {{"message", sanitize_utf8(error.message)},
            {"type", error.type},
            {"param", error.param ? json(*error.param) : json(nullptr)},
            {"code", error.code ? json(*error.code) : json(nullptr)}};
  return json{{"error", e}}.dump();
}

std::optional<ApiError> parse_json_body(std::string_view body, const ApiLimits& limits, json* out) {
  // One pass over the raw text before parsing: the nesting depth outside strings, and lone
  // surrogate escapes rewritten in place as the escape of U+FFFD (both are six characters).
  std::string rewritten;  // a copy of `body`, made only when something is rewritten
  int32_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (!in_string) {
      if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++depth > limits.max_json_depth) {
          ApiError e;
          e.message = "the request body is nested deeper than " +
                      std::to_string(limits.max_json_depth) + " levels of arrays and objects";
          e.code = "invalid_json";
          return e;
        }
      } else if (c == ']' || c == '}') {
        --depth;
      }
      continue;
    }
    if (c == '"') {
      in_string = false;
    } else if (c == '\\') {
      if (i + 1 < body.size() && body[i + 1] == 'u') {
        const int32_t unit = hex4(body, i + 2);
        const bool paired = is_high_surrogate(unit) && i + 11 < body.size() &&
                            body[i + 6] == '\\' && body[i + 7] == 'u' &&
                            is_low_surrogate(hex4(body, i + 8));
        if (paired) {
          i += 11;
          continue;
        }
        if (is_high_surrogate(unit) || is_low_surrogate(unit)) {
          if (rewritten.empty()) rewritten.assign(body);
          rewritten.replace(i, 6, "\\ufffd");
        }
        if (unit >= 0) i += 5;
      } else {
        ++i;  // the escaped character
      }
    }
  }
  *out = json::parse(rewritten.empty() ? body : std::string_view(rewritten), nullptr,
                     /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    ApiError e;
    e.message = "the request body is not valid JSON";
    e.code = "invalid_json";
    return e;
  }
  return std::nullopt;
}

std::optional<std::string> submit_error_param(const Status& status, bool chat) {
  if (status.code() == StatusCode::kResourceExhausted) return std::nullopt;
  const std::string& message = status.message();
  // The engine's messages name the field first, as "field = value ..." or "field: ...".
  for (const char* field : {"n", "stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words",
                            "min_tokens", "max_tokens"}) {
    for (const char* separator : {" = ", ":"}) {
      if (message.rfind(std::string(field) + separator, 0) == 0) return field;
    }
  }
  return chat ? "messages" : "prompt";
}

ApiError api_error_from_status(const Status& status, std::optional<std::string> param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      e.status = 400;
      e.code = "invalid_value";
      break;
    case StatusCode::kOutOfRange:
      e.status = 400;
      e.code = "context_length_exceeded";
      break;
    case StatusCode::kNotFound:
      e.status = 404;
      e.code = "not_found";
      break;
    case StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      e.code = "service_unavailable";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      break;
  }
  return e;
}

namespace {

// ^[a-zA-Z0-9_-]{1,64}$, OpenAI's rule for function names.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

// tools, tool_choice, parallel_tool_calls; the legacy functions/function_call are refused.
void parse_tools(Fields& f, const ApiLimits& limits, ChatRequest* out) {
  if (const json* tools = f.get("tools"); tools && !f.error) {
    if (!tools->is_array()) {
      return f.fail("tools", "'tools' must be an array, got " + type_name(*tools));
    }
    if (static_cast<int64_t>(tools->size()) > limits.max_tools) {
      return f.fail("tools", "'tools' has " + std::to_string(tools->size()) + " entries, at most " +
                                 std::to_string(limits.max_tools) + " are allowed");
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object()) return f.fail(where, "'" + where + "' must be an object");
      const auto type = tool.find("type");
      if (type == tool.end() || !type->is_string() || *type != "function") {
        return f.fail_unsupported(where + ".type", "'" + where +
                                                       ".type' must be \"function\" (the only "
                                                       "tool type supported)");
      }
      const auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) {
        return f.fail(where + ".function", "'" + where + ".function' must be an object");
      }
      const auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() ||
          !valid_function_name(name->get<std::string>())) {
        return f.fail(
            where + ".function.name",
            "'" + where +
                ".function.name' must be a string of 1 to 64 letters, digits, '_' or '-'");
      }
      const auto description = fn->find("description");
      if (description != fn->end() && !description->is_null() && !description->is_string()) {
        return f.fail(where + ".function.description",
                      "'" + where + ".function.description' must be a string");
      }
      const auto parameters = fn->find("parameters");
      if (parameters != fn->end() && !parameters->is_null() && !parameters->is_object()) {
        return f.fail(where + ".function.parameters",
                      "'" + where + ".function.parameters' must be a JSON Schema object");
      }
      const auto strict = fn->find("strict");
      if (strict != fn->end() && !strict->is_null() && !strict->is_boolean()) {
        return f.fail(where + ".function.strict",
                      "'" + where + ".function.strict' must be a boolean");
      }
    }
    out->tools = *tools;
  }
  const bool have_tools = !out->tools.empty();
  out->tool_choice.mode = have_tools ? ToolChoice::Mode::kAuto : ToolChoice::Mode::kNone;
  if (const json* choice = f.get("tool_choice"); choice && !f.error) {
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "none") {
        out->tool_choice.mode = ToolChoice::Mode::kNone;
      } else if (mode == "auto") {
        // "auto" without tools asks for nothing.
      } else if (mode == "required") {
        if (!have_tools) {
          return f.fail("tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools'");
        }
        out->tool_choice.mode = ToolChoice::Mode::kRequired;
      } else {
        return f.fail("tool_choice",
                      "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                          brief(*choice));
      }
    } else if (choice->is_object() && choice->value("type", json()) == "function" &&
               choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].value("name", json()).is_string()) {
      const std::string name = (*choice)["function"]["name"].get<std::string>();
      const bool known = std::any_of(out->tools.begin(), out->tools.end(),
                                     [&](const json& t) { return t["function"]["name"] == name; });
      if (!known) {
        return f.fail("tool_choice",
                      "'tool_choice' names the function '" + name + "', which is not in 'tools'");
      }
      out->tool_choice.mode = ToolChoice::Mode::kNamed;
      out->tool_choice.function_name = name;
    } else {
      return f.fail("tool_choice",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (auto v = f.boolean("parallel_tool_calls")) out->parallel_tool_calls = *v;
  for (const char* name : {"functions", "function_call"}) {
    if (f.get(name) != nullptr) {
      f.fail_unsupported(name, "'" + std::string(name) +
                                   "' (deprecated by OpenAI) is not supported; use 'tools' and "
                                   "'tool_choice'");
    }
  }
}

// An assistant message's tool_calls and a tool message's tool_call_id, as the template reads
// them.
std::optional<ApiError> check_message_tool_fields(const json& m, const std::string& role,
                                                  const std::string& where) {
  if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
    if (role != "assistant") {
      return bad_field(where + ".tool_calls",
                       "'" + where + ".tool_calls' is only allowed on assistant messages");
    }
    if (!it->is_array())
      return bad_field(where + ".tool_calls", "'" + where + ".tool_calls' must be an array");
    for (size_t k = 0; k < it->size(); ++k) {
      const json& c = (*it)[k];
      const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object() || c.value("type", json()) != "function" || !c.contains("function") ||
          !c["function"].is_object()) {
        return bad_field(cw, "'" + cw +
                                 "' must be {\"id\", \"type\": \"function\", \"function\": "
                                 "{\"name\", \"arguments\"}}");
      }
      if (!c["function"].value("name", json()).is_string()) {
        return bad_field(cw + ".function.name", "'" + cw + ".function.name' must be a string");
      }
      if (!c["function"].value("arguments", json()).is_string()) {
        return bad_field(cw + ".function.arguments",
                         "'" + cw + ".function.arguments' must be a string (JSON text)");
      }
      if (c.contains("id") && !c["id"].is_null() && !c["id"].is_string()) {
        return bad_field(cw + ".id", "'" + cw + ".id' must be a string");
      }
    }
  }
  if (auto it = m.find("tool_call_id"); it != m.end() && !it->is_null() && !it->is_string()) {
    return bad_field(where + ".tool_call_id", "'" + where + ".tool_call_id' must be a string");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_kv_push(const json& push, CompletionRequest* out) {
  const std::string name = "peerserve_kv_push";
  if (!push.is_object()) return bad_field(name, "'" + name + "' must be an object");
  if (out->prompts.size() != 1) {
    return bad_field(name, "'" + name + "' needs exactly one prompt");
  }
  KvPushTarget target;
  const auto endpoint = push.find("endpoint");
  if (endpoint == push.end() || !endpoint->is_string()) {
    return bad_field(name + ".endpoint", "'" + name + ".endpoint' must be a string HOST:PORT");
  }
  target.endpoint = endpoint->get<std::string>();
  const size_t colon = target.endpoint.rfind(':');
  const std::string port =
      colon == std::string::npos ? std::string() : target.endpoint.substr(colon + 1);
  const bool port_ok =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      std::stoi(port) >= 1 && std::stoi(port) <= 65535;
  if (target.endpoint.size() > 300 || colon == 0 || !port_ok) {
    return bad_field(name + ".endpoint", "'" + name + ".endpoint' must be HOST:PORT, got '" +
                                             target.endpoint.substr(0, 80) + "'");
  }
  const auto transfer = push.find("transfer");
  if (transfer == push.end() || !transfer->is_string()) {
    return bad_field(name + ".transfer", "'" + name + ".transfer' must be a string");
  }
  target.transfer = transfer->get<std::string>();
  if (Status valid = validate_tenant_name(target.transfer); !valid.ok()) {
    return bad_field(name + ".transfer", "'" + name + ".transfer': " + valid.message());
  }
  const auto first = push.find("first_block");
  if (first != push.end()) {
    if (!first->is_number_unsigned() ||
        first->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return bad_field(name + ".first_block",
                       "'" + name + ".first_block' must be an integer between 0 and " +
                           std::to_string(std::numeric_limits<int32_t>::max()));
    }
    target.first_block = static_cast<int64_t>(first->get<uint64_t>());
  }
  const auto tail = push.find("tail");
  if (tail != push.end()) {
    if (!tail->is_boolean()) {
      return bad_field(name + ".tail", "'" + name + ".tail' must be a boolean");
    }
    target.tail = tail->get<bool>();
  }
  out->kv_push = std::move(target);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_token_ids(const json& array, const std::string& field,
                                        std::vector<TokenId>* ids) {
  Fields f(array);
  for (const json& item : array) {
    const auto id = f.as_integer(item, field, 0, std::numeric_limits<int32_t>::max());
    if (!id) return f.error;
    ids->push_back(static_cast<TokenId>(*id));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const json& body, const ApiLimits& limits,
                                                 CompletionRequest* out) {
  if (auto e = require_object(body)) return e;
  Fields f(body);
  parse_common(f, limits, /*chat=*/false, out);
  if (auto v = f.integer("logprobs", 0, limits.max_top_logprobs)) {
    out->params.sampling.want_logprobs = true;
    out->params.sampling.top_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = f.boolean("echo")) out->echo = *v;
  if (auto v = f.boolean("add_special_tokens")) out->add_special_tokens = *v;
  if (auto v = f.string("suffix"); v && !v->empty()) {
    f.fail_unsupported("suffix", "'suffix' is not supported");
  }
  if (f.error) return f.error;
  if (out->params.max_tokens == 0) {
    if (!out->echo) {
      return bad_field("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': true)");
    }
    // The prompt alone (OpenAI, vLLM): the engine computes one token, which is not sent.
    out->echo_only = true;
    out->params.max_tokens = 1;
  }
  if (out->echo && out->params.sampling.want_logprobs) {
    // The echoed prompt's tokens come with their logprobs.
    out->params.prompt_logprobs =
        std::max(out->params.prompt_logprobs.value_or(0), out->params.sampling.top_logprobs);
  }

  const json* prompt = f.get("prompt");
  if (prompt == nullptr) return bad_field("prompt", "'prompt' is required");
  auto token_list = [&](const json& arr, std::vector<TokenId>* ids) -> bool {
    if (std::optional<ApiError> e = parse_token_ids(arr, "prompt", ids)) f.error = std::move(e);
    return !f.error;
  };
  if (prompt->is_string()) {
    out->prompts.emplace_back(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) return bad_field("prompt", "'prompt' must not be an empty array");
    const json& first = prompt->front();
    if (first.is_number()) {
      std::vector<TokenId> ids;
      if (!token_list(*prompt, &ids)) return f.error;
      out->prompts.emplace_back(std::move(ids));
    } else {
      for (const json& item : *prompt) {
        if (item.is_string()) {
          out->prompts.emplace_back(item.get<std::string>());
        } else if (item.is_array() && !item.empty() && item.front().is_number()) {
          std::vector<TokenId> ids;
          if (!token_list(item, &ids)) return f.error;
          out->prompts.emplace_back(std::move(ids));
        } else {
          return bad_field("prompt",
                           "'prompt' must be a string, an array of strings, an array of token "
                           "ids or an array of token-id arrays; found an element that is " +
                               type_name(item));
        }
      }
    }
  } else {
    return bad_field("prompt", "'prompt' must be a string, an array of strings or token ids, got " +
                                   type_name(*prompt));
  }
  if (static_cast<int32_t>(out->prompts.size()) > limits.max_prompts) {
    return bad_field("prompt", "'prompt' has " + std::to_string(out->prompts.size()) +
                                   " prompts, at most " + std::to_string(limits.max_prompts) +
                                   " are allowed");
  }
  if (auto expected = f.string("peerserve_kv_namespace")) {
    out->expected_kv_namespace = std::move(*expected);
  }
  if (const json* push = f.get("peerserve_kv_push")) {
    if (auto e = parse_kv_push(*push, out)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(const json& body, const ApiLimits& limits,
                                           ChatRequest* out) {
  if (auto e = require_object(body)) return e;
  Fields f(body);
  parse_common(f, limits, /*chat=*/true, out);
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const auto top = f.integer("top_logprobs", 0, limits.max_top_logprobs);
  if (top && !logprobs) {
    f.fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
  }
  out->params.sampling.want_logprobs = logprobs;
  out->params.sampling.top_logprobs = static_cast<int32_t>(top.value_or(0));
  if (auto v = f.boolean("add_generation_prompt")) out->add_generation_prompt = *v;
  if (auto v = f.boolean("continue_final_message")) {
    out->continue_final_message = *v;
    if (*v && out->add_generation_prompt) {
      // As vLLM: add_generation_prompt defaults to true, so it has to be turned off.
      f.fail("continue_final_message",
             "'continue_final_message' needs 'add_generation_prompt': false");
    }
  }
  parse_tools(f, limits, out);
  if (out->structured_output && !out->tools.empty() &&
      out->tool_choice.mode != ToolChoice::Mode::kNone && !f.error) {
    // A tool call's markup is not in the answer's language: the two would fight.
    f.fail_unsupported(out->structured_output->field,
                       "'" + out->structured_output->field +
                           "' cannot be combined with tools unless tool_choice is \"none\"");
  }
  if (auto v = f.boolean("echo"); v && *v) {
    f.fail_unsupported("echo", "'echo' is not supported for chat completions");
  }
  if (const json* kwargs = f.get("chat_template_kwargs"); kwargs && !f.error) {
    if (!kwargs->is_object()) {
      f.fail("chat_template_kwargs",
             "'chat_template_kwargs' must be an object, got " + type_name(*kwargs));
    } else {
      for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
        const std::string& key = it.key();
        if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" ||
            key == "eos_token") {
          continue;
        }
        out->template_variables[key] = it.value();
      }
    }
  }
  // As transformers and vLLM render it: `tools` is None when the request has none (a
  // template testing `tools is not none` must not see an undefined value), and when
  // tool_choice is "none" (which drops them from the prompt here).
  if (out->tool_choice.mode != ToolChoice::Mode::kNone) {
    out->template_variables["tools"] = out->tools;
  } else if (!out->template_variables.contains("tools")) {
    out->template_variables["tools"] = nullptr;
  }
  if (f.error) return f.error;

  const json* messages = f.get("messages");
  if (messages == nullptr) return bad_field("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    return bad_field("messages", "'messages' must be a non-empty array of messages");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_field(where, "'" + where + "' must be an object");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return bad_field(where + ".role", "'" + where + ".role' is required and must be a string");
    }
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return bad_field(where + ".role", "'" + where +
                                            ".role' must be one of system, developer, "
                                            "user, assistant, tool; got '" +
                                            role + "'");
    }
    json msg = m;
    msg["role"] = role;
    if (auto e = check_message_tool_fields(m, role, where)) return e;
    const bool has_tool_calls = role == "assistant" && m.contains("tool_calls") &&
                                !m["tool_calls"].is_null() && !m["tool_calls"].empty();
    if (role == "assistant" && !has_tool_calls) msg.erase("tool_calls");
    auto content_it = m.find("content");
    if (content_it == m.end() || content_it->is_null() ||
        (has_tool_calls && content_it->is_string() && content_it->get<std::string>().empty())) {
      if (role != "assistant") {
        return bad_field(where + ".content", "'" + where + ".content' is required");
      }
      // DeepSeek's template renders the calls of an assistant message whose content is none.
      msg["content"] = has_tool_calls ? json(nullptr) : json("");
    } else if (content_it->is_array()) {
      std::string text;
      for (size_t k = 0; k < content_it->size(); ++k) {
        const json& part = (*content_it)[k];
        const std::string pwhere = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
          return bad_field(pwhere, "'" + pwhere + "' must be an object with a 'type'");
        }
        const std::string type = part["type"].get<std::string>();
        if (type != "text") {
          ApiError e = unsupported(
              pwhere, "content parts of type '" + type + "' are not supported (only 'text')");
          return e;
        }
        if (!part.contains("text") || !part["text"].is_string()) {
          return bad_field(pwhere + ".text", "'" + pwhere + ".text' must be a string");
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (!content_it->is_string()) {
      return bad_field(where + ".content", "'" + where +
                                               ".content' must be a string or an array of "
                                               "content parts, got " +
                                               type_name(*content_it));
    }
    out->messages.push_back(std::move(msg));
  }
  if (const json* forced =
          body.contains("peerserve_forced_output") ? &body["peerserve_forced_output"] : nullptr;
      forced && !forced->is_null()) {
    int64_t turn = 0;
    for (const json& m : out->messages) turn += m["role"] == "assistant" ? 1 : 0;
    if (forced->is_string()) {
      out->forced_output = forced->get<std::string>();
    } else if (forced->is_array() && !forced->empty() &&
               std::all_of(forced->begin(), forced->end(),
                           [](const json& t) { return t.is_string(); })) {
      out->forced_output =
          (*forced)[std::min<size_t>(static_cast<size_t>(turn), forced->size() - 1)]
              .get<std::string>();
    } else {
      return bad_field(
          "peerserve_forced_output",
          "'peerserve_forced_output' must be a string or a non-empty array of strings");
    }
  }
  return std::nullopt;
}

std::string finish_reason_string(FinishReason reason) {
  return std::string(finish_reason_name(reason));
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens}}}};
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and values beyond U+10FFFF.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))) {
      ok = false;
    }
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string token_display(const Tokenizer* tokenizer, TokenId id) {
  if (tokenizer == nullptr || !tokenizer->has_token(id)) return "token_id:" + std::to_string(id);
  return sanitize_utf8(tokenizer->token_bytes(id));
}

std::vector<int> token_bytes_list(const Tokenizer* tokenizer, TokenId id) {
  const bool named = tokenizer != nullptr && tokenizer->has_token(id);
  const std::string text =
      named ? std::string(tokenizer->token_bytes(id)) : token_display(nullptr, id);
  return std::vector<int>(reinterpret_cast<const unsigned char*>(text.data()),
                          reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

namespace {

// OpenAI reports -9999.0 for log(0); JSON has no -inf.
double finite_logprob(float lp) {
  return std::isfinite(lp) ? lp : -9999.0;
}

}  // namespace

ordered_json chat_logprobs_json(const std::vector<SampledToken>& tokens, const Tokenizer* names,
                                int32_t top_logprobs, const Tokenizer* sampled_bytes) {
  ordered_json content = ordered_json::array();
  for (const SampledToken& t : tokens) {
    ordered_json top = ordered_json::array();
    for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int32_t>(k) < top_logprobs; ++k) {
      const TokenLogprob& alt = t.top_logprobs[k];
      top.push_back({{"token", token_display(names, alt.token)},
                     {"logprob", finite_logprob(alt.logprob)},
                     {"bytes", token_bytes_list(names, alt.token)}});
    }
    content.push_back({{"token", token_display(names, t.token)},
                       {"logprob", finite_logprob(t.logprob)},
                       {"bytes", token_bytes_list(sampled_bytes, t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

namespace {

ordered_json completion_logprobs_from(const std::vector<SampledToken>& tokens,
                                      const Tokenizer* tokenizer, int32_t top_logprobs,
                                      int64_t text_offset, size_t skip_specials_from) {
  ordered_json toks = ordered_json::array(), lps = ordered_json::array(),
               tops = ordered_json::array(), offsets = ordered_json::array();
  int64_t offset = text_offset;
  for (size_t index = 0; index < tokens.size(); ++index) {
    const SampledToken& t = tokens[index];
    const std::string text = token_display(tokenizer, t.token);
    toks.push_back(text);
    lps.push_back(finite_logprob(t.logprob));
    // In vLLM's order (JSON objects keep the order they are written): the sampled token,
    // always there (OpenAI: up to logprobs + 1 entries), then the most likely first.
    ordered_json top = ordered_json::object();
    top[text] = finite_logprob(t.logprob);
    for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int32_t>(k) < top_logprobs; ++k) {
      const std::string alt = token_display(tokenizer, t.top_logprobs[k].token);
      if (!top.contains(alt)) top[alt] = finite_logprob(t.top_logprobs[k].logprob);
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    const bool left_out = index >= skip_specials_from && tokenizer != nullptr &&
                          tokenizer->has_token(t.token) && tokenizer->is_special(t.token);
    // Characters, as OpenAI counts them; none for a token the text leaves out.
    if (!left_out) offset += static_cast<int64_t>(utf8::count_code_points(text));
  }
  return {{"tokens", std::move(toks)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace

ordered_json completion_logprobs_json(const std::vector<SampledToken>& tokens,
                                      const Tokenizer* tokenizer, int32_t top_logprobs,
                                      int64_t text_offset, bool skip_special_tokens) {
  return completion_logprobs_from(tokens, tokenizer, top_logprobs, text_offset,
                                  skip_special_tokens ? 0 : tokens.size());
}

ordered_json completion_echo_logprobs_json(TokenId first_prompt_token,
                                           const std::vector<PromptTokenLogprob>& prompt,
                                           const std::vector<SampledToken>& generated,
                                           const Tokenizer* tokenizer, int32_t top_logprobs,
                                           int64_t text_offset, bool first_in_text,
                                           bool skip_special_tokens) {
  std::vector<SampledToken> tokens;
  tokens.reserve(prompt.size() + generated.size());
  for (const PromptTokenLogprob& t : prompt) tokens.push_back({t.token, t.logprob, t.top_logprobs});
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  const std::string first = token_display(tokenizer, first_prompt_token);
  const int64_t first_chars =
      first_in_text ? static_cast<int64_t>(utf8::count_code_points(first)) : 0;
  // The echoed prompt's tokens are all in its text (special ones too); the generated ones as
  // the request decodes them.
  ordered_json out =
      completion_logprobs_from(tokens, tokenizer, top_logprobs, text_offset + first_chars,
                               skip_special_tokens ? prompt.size() : tokens.size());
  out["tokens"].insert(out["tokens"].begin(), first);
  out["token_logprobs"].insert(out["token_logprobs"].begin(), nullptr);
  out["top_logprobs"].insert(out["top_logprobs"].begin(), nullptr);
  out["text_offset"].insert(out["text_offset"].begin(), text_offset);
  return out;
}

ordered_json prompt_logprobs_json(const std::vector<PromptTokenLogprob>& prompt,
                                  const Tokenizer* tokenizer, int32_t top_logprobs) {
  ordered_json out = ordered_json::array();
  out.push_back(nullptr);
  for (const PromptTokenLogprob& t : prompt) {
    ordered_json entry = ordered_json::object();
    entry[std::to_string(t.token)] = {{"logprob", finite_logprob(t.logprob)},
                                      {"rank", t.rank},
                                      {"decoded_token", token_display(tokenizer, t.token)}};
    for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int32_t>(k) < top_logprobs; ++k) {
      const TokenLogprob& alt = t.top_logprobs[k];
      const std::string key = std::to_string(alt.token);
      if (entry.contains(key)) continue;
      entry[key] = {{"logprob", finite_logprob(alt.logprob)},
                    {"rank", static_cast<int64_t>(k) + 1},
                    {"decoded_token", token_display(tokenizer, alt.token)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

namespace {

// An ordered object finds a key by a linear search, so building one is quadratic in its keys:
// past these bounds the ordered copy is given up (the caller falls back to the sorted objects)
// rather than let a hostile body cost seconds of a worker.
constexpr size_t kMaxOrderedKeysPerObject = 512;
constexpr size_t kMaxOrderedKeys = 32768;

}  // namespace

std::optional<ordered_json> ordered_body_members(std::string_view body_text,
                                                 std::span<const std::string_view> members) {
  // Keys seen in the object open at each depth (objects that are dropped get no end event,
  // so the count is reset where an object starts, not popped where it ends).
  std::vector<size_t> keys_at_depth;
  size_t keys = 0;
  bool too_many = false;
  bool in_dropped_member = false;  // inside a top-level member that is not kept: not counted
  const auto keep = [&](int depth, ordered_json::parse_event_t event, ordered_json& parsed) {
    const auto level = static_cast<size_t>(std::max(depth, 0));
    if (event == ordered_json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      in_dropped_member = std::find(members.begin(), members.end(), key) == members.end();
      if (in_dropped_member) return false;
    }
    if (in_dropped_member && depth > 1) return true;  // dropped with its member anyway
    if (event == ordered_json::parse_event_t::object_start) {
      if (keys_at_depth.size() <= level + 1) keys_at_depth.resize(level + 2, 0);
      keys_at_depth[level + 1] = 0;
      return true;
    }
    if (event != ordered_json::parse_event_t::key) return true;
    if (keys_at_depth.size() <= level) keys_at_depth.resize(level + 1, 0);
    if (++keys_at_depth[level] > kMaxOrderedKeysPerObject || ++keys > kMaxOrderedKeys) {
      too_many = true;
      return false;
    }
    return true;
  };
  ordered_json parts = ordered_json::parse(body_text, keep, /*allow_exceptions=*/false);
  if (parts.is_discarded() || !parts.is_object() || too_many) return std::nullopt;
  return parts;
}

namespace {

// `original` (as sent, in order) changed to `normalized` (what the parser made of it, sorted):
// keys the parser dropped are dropped, values it changed are replaced, the rest keep their
// place and their own order.
ordered_json merge_in_order(const ordered_json& original, const json& normalized) {
  if (!original.is_object() || !normalized.is_object()) return ordered_json(normalized);
  ordered_json out = ordered_json::object();
  for (auto it = original.begin(); it != original.end(); ++it) {
    const auto n = normalized.find(it.key());
    if (n == normalized.end()) continue;
    out[it.key()] = json(it.value()) == *n ? it.value() : ordered_json(*n);
  }
  for (auto it = normalized.begin(); it != normalized.end(); ++it) {
    if (!out.contains(it.key())) out[it.key()] = ordered_json(it.value());
  }
  return out;
}

}  // namespace

ChatTemplateInput chat_template_input(std::string_view body_text, const ChatRequest& chat) {
  ChatTemplateInput input;
  input.add_generation_prompt = chat.add_generation_prompt;
  input.continue_final_message = chat.continue_final_message;
  input.messages = chat.messages;
  input.extra_variables = chat.template_variables;
  constexpr std::string_view kTemplateMembers[] = {"messages", "tools", "chat_template_kwargs"};
  const std::optional<ordered_json> parts = ordered_body_members(body_text, kTemplateMembers);
  if (!parts) return input;
  const ordered_json* messages = parts->contains("messages") ? &(*parts)["messages"] : nullptr;
  if (messages != nullptr && messages->is_array() && messages->size() == chat.messages.size()) {
    ordered_json ordered = ordered_json::array();
    for (size_t i = 0; i < chat.messages.size(); ++i) {
      ordered.push_back(merge_in_order((*messages)[i], chat.messages[i]));
    }
    input.messages = std::move(ordered);
  }
  ordered_json variables = ordered_json::object();
  const ordered_json* kwargs =
      parts->contains("chat_template_kwargs") ? &(*parts)["chat_template_kwargs"] : nullptr;
  for (auto it = chat.template_variables.begin(); it != chat.template_variables.end(); ++it) {
    const ordered_json* sent = nullptr;
    if (it.key() == "tools" && parts->contains("tools")) {
      sent = &(*parts)["tools"];
    } else if (kwargs != nullptr && kwargs->is_object() && kwargs->contains(it.key())) {
      sent = &(*kwargs)[it.key()];
    }
    variables[it.key()] =
        sent != nullptr && json(*sent) == it.value() ? *sent : ordered_json(it.value());
  }
  input.extra_variables = std::move(variables);
  return input;
}

}  // namespace peerserve
