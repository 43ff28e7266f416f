// The OpenAI API as data: request parsing with validation (every error names the field and
// what was expected, in OpenAI's error shape), and the JSON of responses and stream chunks.
// No I/O here, so all of it is unit-testable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "runtime/request.h"
#include "serve/generation_defaults.h"
#include "serve/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

// {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;
  std::optional<std::string> code;
};

std::string api_error_json(const ApiError& error);
// Maps an engine/tokenizer Status to the HTTP status and OpenAI error type:
// InvalidArgument 400, OutOfRange 400 (context_length_exceeded), NotFound 404,
// ResourceExhausted 429, Unavailable 503, anything else 500.
ApiError api_error_from_status(const Status& status, std::optional<std::string> param = {});

// The request field an engine's refusal of a submitted request names: `n`, `stop_token_ids`
// or `logit_bias` when its message starts with that field, none for a full queue (not the
// request's fault), otherwise the prompt (`messages` for chat).
std::optional<std::string> submit_error_param(const Status& status, bool chat);

// Limits the parser enforces besides the engine's own.
struct ApiLimits {
  int32_t max_n = 16;
  int32_t max_top_logprobs = 20;
  int32_t max_stop_strings = 16;
  int32_t max_prompts = 64;  // prompts in one /v1/completions batch
  // Nesting of arrays and objects in a request body. Checked before the JSON is built, so
  // no later copy, dump or template conversion can recurse deeper.
  int32_t max_json_depth = 64;
  int32_t max_tools = 128;  // entries of a chat request's `tools`, as OpenAI allows
  // What a request that leaves out temperature, top_p, top_k, min_p or repetition_penalty
  // gets (the checkpoint's generation_config.json: serve/generation_defaults.h).
  GenerationDefaults sampling_defaults;
};

// Parses a request body as JSON. Bodies nested deeper than limits.max_json_depth are
// refused without building anything. A lone UTF-16 surrogate escape ("\ud800", valid JSON
// that nlohmann rejects) becomes U+FFFD, as Python's json module and OpenAI's server do.
std::optional<ApiError> parse_json_body(std::string_view body, const ApiLimits& limits,
                                        nlohmann::json* out);

// Fields shared by both endpoints.
struct CommonRequestFields {
  std::optional<std::string> model;
  GenerationParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM's extension) with include_usage: usage
  // (running totals) in every chunk, so a client can count the tokens behind each chunk.
  bool continuous_usage = false;
  // "peerserve_prefill": "HOST:PORT", set by a router (serve --role router --prefill): the
  // prefill instance it chose for this request. A decode instance uses it only when it is one
  // of its own --prefill instances; elsewhere it is ignored.
  std::string prefill_hint;
  // "cache_salt" (OpenAI, vLLM): prefix-cache hits only between requests with the same salt
  // (EngineRequest::cache_salt). Empty: none given.
  std::string cache_salt;
  // "prompt_logprobs" (vLLM's extension): the answer carries every prompt token's logprob
  // with this many alternatives (vLLM's format, prompt_logprobs_json). Not with stream.
  std::optional<int32_t> prompt_logprobs;
  // "truncate_prompt_tokens" (vLLM's): keep the prompt's last k tokens (-1: the last
  // max_model_len); nullopt: a prompt over the context is refused.
  std::optional<int32_t> truncate_prompt_tokens;
  // "return_token_ids" (vLLM's): the answer carries the prompt's token ids and each choice's
  // (streamed: the prompt's in a choice's first chunk, then each chunk's own).
  bool return_token_ids = false;
  // "return_tokens_as_token_ids" (vLLM's): logprobs name their tokens "token_id:N" (bytes:
  // that text's), so a token that is not valid UTF-8 on its own is still told apart.
  bool tokens_as_ids = false;
  // Structured outputs (guided_json / guided_regex / guided_choice, structured_outputs,
  // response_format): the pattern the answer must match; the server compiles it against the
  // vocabulary into params.sampling.constraint (serve/structured_output.h).
  std::optional<StructuredOutputRequest> structured_output;
  // vLLM's bad_words: words the answer must not contain, tokenized by the server into
  // params.sampling.bad_words_ids (serve/bad_words.h).
  std::vector<std::string> bad_words;
};

// The most bad_words entries, and bytes per entry, a request may carry.
inline constexpr int64_t kMaxBadWords = 256;
inline constexpr size_t kMaxBadWordBytes = 1024;

// max_tokens of a /v1/completions request that names none (OpenAI, vLLM).
inline constexpr int64_t kDefaultCompletionMaxTokens = 16;

// The longest cache_salt accepted.
inline constexpr size_t kMaxCacheSaltBytes = 1024;

struct CompletionRequest : CommonRequestFields {
  // One entry per prompt: text or token ids.
  std::vector<std::variant<std::string, std::vector<TokenId>>> prompts;
  // Prefill/decode hand-off (a decode instance asking a prefill instance; one prompt):
  // "peerserve_kv_push": {"endpoint": "HOST:PORT", "transfer": NAME, "first_block": K,
  // "tail": BOOL}.
  std::optional<KvPushTarget> kv_push;
  // "peerserve_kv_namespace": the KV namespace identity the caller (a decode instance)
  // expects; a server with another one refuses the request (it would compute KV the caller
  // cannot use). Empty: not given.
  std::string expected_kv_namespace;
  // "echo": each choice's text (and logprobs) starts with the prompt's. With max_tokens 0
  // (echo_only) the prompt alone: params.max_tokens is then 1 and that token is not sent.
  bool echo = false;
  bool echo_only = false;
  // "add_special_tokens" (vLLM's): text prompts get BOS (the tokenizer's special tokens).
  bool add_special_tokens = true;
};

// OpenAI's tool_choice: "none", "auto", "required" or {"type": "function", "function":
// {"name": NAME}}.
struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = Mode::kNone;
  std::string function_name;  // kNamed
};

struct ChatRequest : CommonRequestFields {
  // Messages as the chat template expects them (content flattened to a string; an
  // assistant message with tool_calls and no text keeps content null).
  nlohmann::json messages = nlohmann::json::array();
  bool add_generation_prompt = true;
  // vLLM's continue_final_message (ChatTemplateInput::continue_final_message).
  bool continue_final_message = false;
  // Further template variables: chat_template_kwargs, and "tools" (the request's tools as
  // sent) unless tool_choice is "none".
  nlohmann::json template_variables = nlohmann::json::object();
  // Function tools, validated; empty when the request has none.
  nlohmann::json tools = nlohmann::json::array();
  // Default: "auto" with tools, "none" without.
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  // Testing hook `peerserve_forced_output` (a text, or one text per conversation turn,
  // picked by the number of assistant messages in `messages`): the server decodes this text
  // instead of the model's choice when started with --allow-forced-output.
  std::optional<std::string> forced_output;
};

// Parses a request body. Unknown fields are ignored (as OpenAI's own server does for
// forward compatibility); known fields with a wrong type or range are errors, and so are
// vLLM's extensions that are not built (guided_*, structured_outputs, ...).
std::optional<ApiError> parse_completion_request(const nlohmann::json& body,
                                                 const ApiLimits& limits, CompletionRequest* out);
std::optional<ApiError> parse_chat_request(const nlohmann::json& body, const ApiLimits& limits,
                                           ChatRequest* out);

// The body's top-level `members` with every object's keys in the order they were sent
// (nlohmann::json sorts them); nullopt when the body is not an object, or holds more keys than
// an ordered copy is worth building (its lookups are linear: a hostile body would cost
// seconds). Other members are skipped unparsed into objects.
std::optional<nlohmann::ordered_json> ordered_body_members(
    std::string_view body_text, std::span<const std::string_view> members);

// The chat template's input for `chat`, parsed from `body_text` (the request body), with the
// body's objects in the order they were sent: nlohmann::json sorts keys, and a template
// printing tools with tojson showed them sorted where transformers shows them as sent. Falls
// back to `chat`'s own (sorted) objects if the body cannot be read again.
ChatTemplateInput chat_template_input(std::string_view body_text, const ChatRequest& chat);

// The token ids of a JSON array (integers 0 .. 2^31 - 1) appended to *ids, as 'prompt' and
// /detokenize's 'tokens' take them; an error naming `field` for any other element.
std::optional<ApiError> parse_token_ids(const nlohmann::json& array, const std::string& field,
                                        std::vector<TokenId>* ids);

// "stop", "length", "abort", "error".
std::string finish_reason_string(FinishReason reason);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}.
nlohmann::json usage_json(const Usage& usage);

// The text of one token for logprobs (invalid UTF-8 replaced), and its raw bytes. Without a
// tokenizer (none loaded, or return_tokens_as_token_ids), "token_id:N" and that text's bytes.
std::string token_display(const Tokenizer* tokenizer, TokenId id);
std::vector<int> token_bytes_list(const Tokenizer* tokenizer, TokenId id);

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
// `names` names every token (nullptr: "token_id:N"); the sampled token's "bytes" come from
// `sampled_bytes`, as vLLM gives them under return_tokens_as_token_ids (the token's own bytes,
// while the top_logprobs entries carry their names' bytes).
nlohmann::ordered_json chat_logprobs_json(const std::vector<SampledToken>& tokens,
                                          const Tokenizer* names, int32_t top_logprobs,
                                          const Tokenizer* sampled_bytes);
// Completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
// `text_offset` is the length of the text before the first token. Offsets index the text
// the response carries: with `skip_special_tokens` (the request's, true by default) a special
// token is left out of that text, so it takes no characters there.
nlohmann::ordered_json completion_logprobs_json(const std::vector<SampledToken>& tokens,
                                                const Tokenizer* tokenizer, int32_t top_logprobs,
                                                int64_t text_offset,
                                                bool skip_special_tokens = false);

// Completions logprobs of an echoed prompt and what follows it: the prompt's first token
// with null logprob and top_logprobs (nothing comes before it), the others with their prompt
// logprobs, then `generated`. `first_in_text`: whether the echoed text holds the first token
// (a BOS the tokenizer added to a text prompt is not in it: offset 0, no characters);
// `skip_special_tokens` as above, for `generated`.
nlohmann::ordered_json completion_echo_logprobs_json(
    TokenId first_prompt_token, const std::vector<PromptTokenLogprob>& prompt,
    const std::vector<SampledToken>& generated, const Tokenizer* tokenizer, int32_t top_logprobs,
    int64_t text_offset, bool first_in_text = true, bool skip_special_tokens = false);
// vLLM's prompt_logprobs: [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...],
// one object per prompt token after the first, holding the token and its top alternatives.
nlohmann::ordered_json prompt_logprobs_json(const std::vector<PromptTokenLogprob>& prompt,
                                            const Tokenizer* tokenizer, int32_t top_logprobs);

// Replaces invalid UTF-8 with U+FFFD (so it can go into JSON).
std::string sanitize_utf8(std::string_view text);

}  // namespace peerserve
