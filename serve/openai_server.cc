#include "serve/openai_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <random>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/thread_pool.h"
#include "grammar/json_schema_regex.h"
#include "serve/bad_words.h"
#include "serve/bearer_auth.h"
#include "serve/prometheus_text.h"
#include "serve/request_workers.h"
#include "serve/tool_call_parser.h"
#include "tokenizer/internal/utf8.h"

namespace peerserve {

// Responses keep the order their members are written in (completions' top_logprobs are
// ordered by likelihood, as vLLM writes them); request bodies are parsed as nlohmann::json.
using json = nlohmann::ordered_json;

struct OpenAiServer::Context {
  OpenAiServerOptions options;
  EngineClient* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  HttpServer* http = nullptr;
  // Graceful shutdown: new generations are refused and /health fails while draining;
  // active_calls counts generation calls not yet finished.
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active_calls{0};
  // Bytes of request bodies queued for or being prepared by the workers.
  std::atomic<uint64_t> inflight_bytes{0};
  std::mutex id_mutex;
  std::mt19937_64 id_rng{std::random_device{}()};
  // Null without a tokenizer.
  std::unique_ptr<StructuredOutputCompiler> structured_outputs;
  // Forced tool calls decoded with any JSON object as arguments (their schemas' pattern was
  // over the automaton's bounds) and without constraint (so was that): /metrics.
  std::atomic<int64_t> forced_calls_any_object{0};
  std::atomic<int64_t> forced_calls_unconstrained{0};

  std::string new_id(const char* prefix) {
    std::lock_guard<std::mutex> lock(id_mutex);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%016llx%08llx", prefix,
                  static_cast<unsigned long long>(id_rng()),
                  static_cast<unsigned long long>(id_rng() & 0xffffffffULL));
    return buf;
  }

  // Declared last, destroyed first: queued work still finds the rest of the context.
  std::unique_ptr<RequestWorkers> workers;
};

namespace {

constexpr const char* kJson = "application/json";

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_error(HttpExchange& exchange, const ApiError& error) {
  exchange.respond(error.status, kJson, api_error_json(error));  // a 429 gets Retry-After
}

ApiError not_found_route(const HttpRequest& request) {
  ApiError e;
  e.status = 404;
  e.message = "unknown route " + request.method + " " + request.path();
  e.code = "not_found";
  return e;
}

std::optional<ApiError> check_model(const OpenAiServer::Context& ctx,
                                    const std::optional<std::string>& model) {
  if (!model || *model == ctx.options.served_model_name) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.message = "The model `" + *model + "` does not exist. This server serves `" +
              ctx.options.served_model_name + "`.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

// Parses the body as JSON (depth-checked, see parse_json_body); on failure sends 400 and
// returns nullopt.
std::optional<nlohmann::json> parse_body(const OpenAiServer::Context& ctx,
                                         const HttpRequest& request, HttpExchange& exchange) {
  nlohmann::json body;
  if (auto e = parse_json_body(request.body, ctx.options.limits, &body)) {
    send_error(exchange, *e);
    return std::nullopt;
  }
  return body;
}

std::string sse(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// How a chat call treats tool calls: off, or parsed from the output (at most max_calls per
// choice, 0 = any), the output starting with `prefix` (forced into the prompt).
struct ToolCallSetup {
  bool enabled = false;
  int32_t max_calls = 0;
  std::string prefix;
};

// A completions request's echo (CompletionRequest::echo): each prompt's text, in order.
struct PromptEcho {
  bool enabled = false;
  bool prompt_only = false;  // max_tokens 0: the generated token is not sent
  std::vector<std::string> texts;
  // Per prompt: whether its first token is in its echoed text (a BOS that tokenizing the
  // text added is not, even when the text itself starts with a BOS of its own).
  std::vector<char> first_token_in_text;
};

// One /v1/chat/completions or /v1/completions call: submits one engine request per prompt,
// then turns the engine's outputs into SSE chunks or one JSON response. Everything but the
// constructor runs on the connection's strand.
class GenerationCall : public std::enable_shared_from_this<GenerationCall> {
 public:
  GenerationCall(OpenAiServer::Context* ctx, std::shared_ptr<HttpExchange> exchange, bool chat,
                 const CommonRequestFields& fields, int32_t top_logprobs,
                 ToolCallSetup tool_setup = {}, PromptEcho echo = {})
      : ctx_(ctx),
        exchange_(std::move(exchange)),
        chat_(chat),
        stream_(fields.stream),
        include_usage_(fields.include_usage),
        continuous_usage_(fields.continuous_usage),
        n_(fields.params.n),
        want_logprobs_(fields.params.sampling.want_logprobs),
        top_logprobs_(top_logprobs),
        id_(ctx->new_id(chat ? "chatcmpl-" : "cmpl-")),
        created_(unix_seconds()),
        tool_setup_(std::move(tool_setup)),
        echo_(std::move(echo)),
        prompt_logprobs_field_(fields.prompt_logprobs),
        return_token_ids_(fields.return_token_ids),
        logprob_names_(fields.tokens_as_ids ? nullptr : ctx->tokenizer),
        skip_special_tokens_(fields.params.skip_special_tokens) {
    ++ctx_->active_calls;
  }
  ~GenerationCall() { --ctx_->active_calls; }
  GenerationCall(const GenerationCall&) = delete;
  GenerationCall& operator=(const GenerationCall&) = delete;

  // Submits every prompt; on the first failure aborts what was submitted and answers with
  // the error.
  void start(std::vector<EngineRequest> requests) {
    const int32_t num_prompts = static_cast<int32_t>(requests.size());
    // More sequences than the waiting queue ever holds: a 429 ("retry later") would be
    // retried in vain.
    const int64_t sequences = int64_t{num_prompts} * n_;
    const int64_t queue = ctx_->engine->waiting_capacity();
    if (sequences > queue) {
      done_ = true;
      send_error(*exchange_,
                 api_error_from_status(
                     invalid_argument(std::to_string(num_prompts) + " prompt(s) x n = " +
                                      std::to_string(n_) + " is " + std::to_string(sequences) +
                                      " sequences, more than the " + std::to_string(queue) +
                                      " the waiting queues hold (--max-waiting-requests)"),
                     n_ > 1 ? "n" : (chat_ ? "messages" : "prompt")));
      return;
    }
    choices_.resize(static_cast<size_t>(num_prompts) * n_);
    usage_.resize(num_prompts);
    prompts_.resize(num_prompts);
    for (int32_t p = 0; p < num_prompts; ++p) {
      // An empty prompt is refused by the engine below, before anything reads this.
      const std::vector<TokenId>& tokens = requests[p].prompt_tokens;
      if (!tokens.empty()) prompts_[p].first_token = tokens.front();
      if (echo_.enabled) prompts_[p].first_token_in_text = echo_.first_token_in_text[p] != 0;
      if (return_token_ids_) prompts_[p].tokens = tokens;
    }
    // A forced call's start is part of the answer: a named call's header goes out at once.
    std::vector<json> prefix_deltas(choices_.size(), json::object());
    if (tool_setup_.enabled) {
      for (size_t i = 0; i < choices_.size(); ++i) {
        choices_[i].tools.emplace(tool_setup_.max_calls);
        prefix_deltas[i] =
            tool_events_delta(choices_[i], choices_[i].tools->feed(tool_setup_.prefix));
      }
    }
    for (int32_t p = 0; p < num_prompts; ++p) {
      // Known now: the first chunks' continuous usage reports it, as vLLM's do.
      usage_[static_cast<size_t>(p)].prompt_tokens =
          static_cast<int64_t>(requests[static_cast<size_t>(p)].prompt_tokens.size());
      auto self = shared_from_this();
      auto exchange = exchange_;
      EngineClient::OutputSink sink = [self, exchange, p](RequestOutput out) {
        exchange->post([self, p, out = std::move(out)]() mutable { self->on_output(p, out); });
      };
      Result<RequestId> id = ctx_->engine->submit(std::move(requests[p]), std::move(sink));
      if (!id.ok()) {
        for (RequestId submitted : request_ids_) ctx_->engine->abort(submitted);
        done_ = true;
        send_error(*exchange_,
                   api_error_from_status(id.status(), submit_error_param(id.status(), chat_)));
        return;
      }
      request_ids_.push_back(*id);
    }
    num_unfinished_prompts_ = num_prompts;
    EngineClient* engine = ctx_->engine;
    std::vector<RequestId> ids = request_ids_;
    exchange_->on_disconnect([engine, ids] {
      for (RequestId id : ids) engine->abort(id);
    });
    if (stream_) {
      exchange_->start_stream("text/event-stream");
      if (chat_) {
        // The first chunk of each choice carries the role, as OpenAI's does.
        for (int32_t i = 0; i < static_cast<int32_t>(choices_.size()); ++i) {
          json choice = {{"index", i},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}};
          json first = chunk_envelope(json::array({choice}), i);
          if (return_token_ids_) first["prompt_token_ids"] = prompts_[i / n_].tokens;
          exchange_->write_chunk(sse(first));
          if (!prefix_deltas[i].empty()) {
            json header = {{"index", i},
                           {"delta", std::move(prefix_deltas[i])},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}};
            exchange_->write_chunk(sse(chunk_envelope(json::array({header}), i)));
          }
        }
      }
    }
  }

 private:
  struct ChoiceState {
    std::string text;
    std::vector<SampledToken> logprobs;
    std::optional<FinishReason> finish;
    json stop_reason = nullptr;
    int64_t text_length = 0;         // for completion text_offset
    int64_t tokens = 0;              // generated so far (continuous usage stats)
    bool streamed = false;           // stream: the choice's first chunk went out
    std::vector<TokenId> token_ids;  // return_token_ids, not streamed
    // Tool calling: the parser, the content it let through, and the calls whose header it
    // let through, each with the id the stream gave it and the argument text it sent.
    struct StartedCall {
      std::string id;
      ParsedToolCall call;
    };
    std::optional<ToolCallStreamParser> tools;
    std::string tool_content;
    std::vector<StartedCall> started_calls;
  };

  // Per prompt: what echo and prompt_logprobs answer with.
  struct PromptState {
    TokenId first_token = 0;
    bool first_token_in_text = true;           // in the echoed text (completion_echo_logprobs_json)
    std::vector<PromptTokenLogprob> logprobs;  // RequestOutput::prompt_logprobs
    std::vector<TokenId> tokens;               // return_token_ids
  };

  // The delta (content and/or tool_calls) for parser events; calls get their ids here.
  json tool_events_delta(ChoiceState& c, const std::vector<ToolCallEvent>& events) {
    std::string content;
    json calls = json::array();
    for (const ToolCallEvent& e : events) {
      switch (e.kind) {
        case ToolCallEvent::Kind::kContent:
          content += e.text;
          break;
        case ToolCallEvent::Kind::kCallStart:
          c.started_calls.push_back({ctx_->new_id("call_"), {e.text, ""}});
          calls.push_back({{"index", e.index},
                           {"id", c.started_calls.back().id},
                           {"type", "function"},
                           {"function", {{"name", e.text}, {"arguments", ""}}}});
          break;
        case ToolCallEvent::Kind::kArguments:
          if (e.index >= 0 && static_cast<size_t>(e.index) < c.started_calls.size()) {
            c.started_calls[static_cast<size_t>(e.index)].call.arguments += e.text;
          }
          if (!calls.empty() && calls.back()["index"] == e.index) {
            calls.back()["function"]["arguments"] =
                calls.back()["function"]["arguments"].get<std::string>() + e.text;
          } else {
            calls.push_back({{"index", e.index}, {"function", {{"arguments", e.text}}}});
          }
          break;
      }
    }
    c.tool_content += content;
    json delta = json::object();
    if (!content.empty()) delta["content"] = std::move(content);
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    return delta;
  }

  // "tool_calls" when the choice called tools and ended normally.
  json finish_reason_json(const ChoiceState& c) const {
    if (!c.finish) return nullptr;
    if (c.tools && c.tools->called_tools() &&
        (*c.finish == FinishReason::kStop || *c.finish == FinishReason::kLength)) {
      return "tool_calls";
    }
    return finish_reason_string(*c.finish);
  }

  // `choice`: the index of the one choice in `choices`, whose usage continuous_usage_stats
  // reports (its prompt's tokens and its own, as vLLM does); none: the request's.
  json chunk_envelope(json choices, std::optional<int32_t> choice = std::nullopt) const {
    json chunk = {{"id", id_},
                  {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", ctx_->options.served_model_name},
                  {"choices", std::move(choices)}};
    if (continuous_usage_ && choice) {
      Usage usage = usage_[static_cast<size_t>(*choice / n_)];
      usage.completion_tokens = choices_[static_cast<size_t>(*choice)].tokens;
      chunk["usage"] = usage_json(usage);
    } else if (continuous_usage_) {
      chunk["usage"] = usage_json(total_usage());
    } else if (include_usage_) {
      chunk["usage"] = nullptr;
    }
    return chunk;
  }

  // `with_prompt`: the echoed prompt's tokens first (CompletionRequest::echo).
  json logprobs_json(const std::vector<SampledToken>& tokens, int64_t text_offset,
                     const PromptState* with_prompt = nullptr) const {
    if (!want_logprobs_) return nullptr;
    if (with_prompt != nullptr) {
      return completion_echo_logprobs_json(with_prompt->first_token, with_prompt->logprobs, tokens,
                                           logprob_names_, top_logprobs_, text_offset,
                                           with_prompt->first_token_in_text, skip_special_tokens_);
    }
    return chat_ ? chat_logprobs_json(tokens, logprob_names_, top_logprobs_, ctx_->tokenizer)
                 : completion_logprobs_json(tokens, logprob_names_, top_logprobs_, text_offset,
                                            skip_special_tokens_);
  }

  // `delta` as echo answers it: with max_tokens 0 the one token computed is not part of the
  // answer, nor why it ended; `prompt_first` puts the prompt's text before the delta's.
  ChoiceDelta with_echo(const ChoiceDelta& delta, int32_t prompt, bool prompt_first) const {
    ChoiceDelta out = delta;
    if (echo_.prompt_only) {
      out.token_ids.clear();
      out.text.clear();
      out.logprobs.clear();
      out.stop_string.reset();
      out.stop_token.reset();
      if (out.finish_reason && *out.finish_reason != FinishReason::kAbort &&
          *out.finish_reason != FinishReason::kError) {
        out.finish_reason = FinishReason::kLength;
      }
    }
    if (prompt_first) out.text = echo_.texts[static_cast<size_t>(prompt)] + out.text;
    return out;
  }

  void on_output(int32_t prompt, const RequestOutput& out) {
    if (done_) return;
    if (!out.error.ok()) {
      fail(api_error_from_status(out.error));
      return;
    }
    usage_[prompt] = out.usage;
    if (echo_.prompt_only) usage_[prompt].completion_tokens = 0;  // none is sent
    if (!out.prompt_logprobs.empty()) prompts_[prompt].logprobs = out.prompt_logprobs;
    json stream_choices = json::array();
    for (const ChoiceDelta& engine_delta : out.choices) {
      const int32_t index = prompt * n_ + engine_delta.index;
      ChoiceState& c = choices_[index];
      // Streamed echo: the prompt's text and logprobs go out in the choice's first chunk.
      const bool echo_now = stream_ && echo_.enabled && !c.streamed;
      std::optional<ChoiceDelta> echoed;
      if (echo_now || echo_.prompt_only) echoed = with_echo(engine_delta, prompt, echo_now);
      const ChoiceDelta& delta = echoed ? *echoed : engine_delta;
      const int64_t offset = c.text_length;
      c.text += delta.text;
      c.tokens += static_cast<int64_t>(delta.token_ids.size());
      c.text_length += static_cast<int64_t>(utf8::count_code_points(delta.text));
      if (want_logprobs_)
        c.logprobs.insert(c.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
      if (return_token_ids_ && !stream_) {
        c.token_ids.insert(c.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
      }
      if (delta.finish_reason) {
        c.finish = delta.finish_reason;
        if (delta.stop_string) {
          c.stop_reason = *delta.stop_string;
        } else if (delta.stop_token) {
          c.stop_reason = *delta.stop_token;
        }
      }
      json tool_delta = json::object();
      if (c.tools) {
        std::vector<ToolCallEvent> events = c.tools->feed(delta.text);
        if (delta.finish_reason) {
          std::vector<ToolCallEvent> rest = c.tools->finish();
          events.insert(events.end(), rest.begin(), rest.end());
        }
        tool_delta = tool_events_delta(c, events);
      }
      if (!stream_) continue;
      const bool has_logprobs = want_logprobs_ && !delta.logprobs.empty();
      // A step that produced tokens whose text is held back (part of a UTF-8 character, a
      // possible stop string) still gets its chunk, with empty text, as vLLM sends it: a
      // client sees one chunk per step and measures the gaps between steps. Tool-call
      // parsing holds text back on purpose and sends nothing until it can.
      const bool has_content =
          c.tools ? !tool_delta.empty() || has_logprobs
                  : !delta.text.empty() || has_logprobs || !delta.token_ids.empty() || echo_now;
      if (!has_content && !delta.finish_reason) continue;
      json choice = {{"index", index},
                     {"logprobs", logprobs_json(delta.logprobs, offset,
                                                echo_now ? &prompts_[prompt] : nullptr)}};
      if (chat_ && c.tools) {
        if (tool_delta.empty() && has_logprobs) tool_delta["content"] = "";
        choice["delta"] = std::move(tool_delta);
      } else if (chat_) {
        choice["delta"] = delta.text.empty() && delta.finish_reason && !has_content
                              ? json::object()
                              : json{{"content", delta.text}};
      } else {
        choice["text"] = delta.text;
      }
      choice["finish_reason"] = finish_reason_json(c);
      if (delta.finish_reason) choice["stop_reason"] = c.stop_reason;
      if (return_token_ids_) {
        if (!chat_ && !c.streamed) {
          choice["prompt_token_ids"] = prompts_[prompt].tokens;  // chat: in the role chunk
        }
        choice["token_ids"] = delta.token_ids;
      }
      c.streamed = true;  // an echo's first delta always has content, so it got here
      stream_choices.push_back(std::move(choice));
    }
    // One chunk per choice, as OpenAI and vLLM stream n > 1 (clients read choices[0]).
    for (json& choice : stream_choices) {
      const auto index = choice["index"].get<int32_t>();
      exchange_->write_chunk(sse(chunk_envelope(json::array({std::move(choice)}), index)));
    }
    if (out.finished && --num_unfinished_prompts_ == 0) finish();
  }

  Usage total_usage() const {
    Usage total;
    for (const Usage& u : usage_) {
      total.prompt_tokens += u.prompt_tokens;
      total.completion_tokens += u.completion_tokens;
      total.cached_prompt_tokens += u.cached_prompt_tokens;
    }
    return total;
  }

  void finish() {
    done_ = true;
    const Usage usage = total_usage();
    if (stream_) {
      if (include_usage_) {
        json last = chunk_envelope(json::array());
        last["usage"] = usage_json(usage);
        exchange_->write_chunk(sse(last));
      }
      exchange_->write_chunk("data: [DONE]\n\n");
      exchange_->end_stream();
      return;
    }
    json choices = json::array();
    for (int32_t i = 0; i < static_cast<int32_t>(choices_.size()); ++i) {
      const ChoiceState& c = choices_[i];
      const PromptState& prompt = prompts_[static_cast<size_t>(i / n_)];
      json choice = {{"index", i},
                     {"logprobs", logprobs_json(c.logprobs, 0, echo_.enabled ? &prompt : nullptr)},
                     {"finish_reason", finish_reason_json(c)},
                     {"stop_reason", c.stop_reason}};
      if (!chat_ && prompt_logprobs_field_) {
        choice["prompt_logprobs"] =
            prompt_logprobs_json(prompt.logprobs, ctx_->tokenizer, *prompt_logprobs_field_);
      }
      if (return_token_ids_) {
        if (!chat_) choice["prompt_token_ids"] = prompt.tokens;  // chat: the response's
        choice["token_ids"] = c.token_ids;
      }
      // A well-formed answer: its calls. A forced call (the server began it in the prompt)
      // that went wrong: what the stream sent, the calls begun with the argument text that
      // went out and the rest as content, so that both forms of the answer agree (vLLM's
      // named tool_choice likewise always answers with the call). Otherwise: text.
      const bool forced_call_failed = chat_ && c.tools && !c.tools->called_tools() &&
                                      !tool_setup_.prefix.empty() && !c.started_calls.empty();
      if (chat_ && c.tools && (c.tools->called_tools() || forced_call_failed)) {
        json calls = json::array();
        const size_t count = forced_call_failed ? c.started_calls.size() : c.tools->calls().size();
        for (size_t k = 0; k < count; ++k) {
          const ParsedToolCall& call =
              forced_call_failed ? c.started_calls[k].call : c.tools->calls()[k];
          calls.push_back(
              {{"id", k < c.started_calls.size() ? c.started_calls[k].id : ctx_->new_id("call_")},
               {"type", "function"},
               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        choice["message"] = {
            {"role", "assistant"},
            {"content", c.tool_content.empty() ? json(nullptr) : json(c.tool_content)},
            {"tool_calls", std::move(calls)}};
      } else if (chat_ && c.tools) {
        // No well-formed call: the whole output as text, forced prefix included.
        choice["message"] = {{"role", "assistant"}, {"content", tool_setup_.prefix + c.text}};
      } else if (chat_) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      } else {
        choice["text"] = echo_.enabled ? echo_.texts[static_cast<size_t>(i / n_)] + c.text : c.text;
      }
      choices.push_back(std::move(choice));
    }
    json response = {{"id", id_},
                     {"object", chat_ ? "chat.completion" : "text_completion"},
                     {"created", created_},
                     {"model", ctx_->options.served_model_name},
                     {"choices", std::move(choices)},
                     {"usage", usage_json(usage)},
                     {"system_fingerprint", nullptr}};
    if (chat_ && return_token_ids_) response["prompt_token_ids"] = prompts_.front().tokens;
    if (chat_ && prompt_logprobs_field_) {
      // vLLM's place for them in a chat answer (one prompt).
      response["prompt_logprobs"] =
          prompt_logprobs_json(prompts_.front().logprobs, ctx_->tokenizer, *prompt_logprobs_field_);
    }
    exchange_->respond(200, kJson, response.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  void fail(const ApiError& error) {
    done_ = true;
    for (RequestId id : request_ids_) ctx_->engine->abort(id);
    if (stream_) {
      exchange_->write_chunk("data: " + api_error_json(error) + "\n\n");
      exchange_->write_chunk("data: [DONE]\n\n");
      exchange_->end_stream();
    } else {
      send_error(*exchange_, error);
    }
  }

  OpenAiServer::Context* ctx_;
  std::shared_ptr<HttpExchange> exchange_;
  const bool chat_;
  const bool stream_;
  const bool include_usage_;
  const bool continuous_usage_;
  const int32_t n_;
  const bool want_logprobs_;
  const int32_t top_logprobs_;
  const std::string id_;
  const int64_t created_;
  const ToolCallSetup tool_setup_;
  const PromptEcho echo_;
  const std::optional<int32_t> prompt_logprobs_field_;
  const bool return_token_ids_;
  // Names the logprobs' tokens; null with return_tokens_as_token_ids ("token_id:N").
  const Tokenizer* const logprob_names_;
  const bool skip_special_tokens_;  // the request's: text_offset counts what the text holds
  std::vector<PromptState> prompts_;
  std::vector<RequestId> request_ids_;
  std::vector<ChoiceState> choices_;
  std::vector<Usage> usage_;
  int32_t num_unfinished_prompts_ = 0;
  bool done_ = false;
};

// A GenerationCall runs on its connection's strand (its outputs arrive there); handlers run
// on the request workers, so the start goes through the strand too. Started directly, a
// request that finishes at once could deliver its last output before start() has counted
// the prompts, and the response would never be sent.
void start_on_strand(std::shared_ptr<GenerationCall> call,
                     const std::shared_ptr<HttpExchange>& exchange,
                     std::vector<EngineRequest> requests) {
  exchange->post([call = std::move(call), requests = std::move(requests)]() mutable {
    call->start(std::move(requests));
  });
}

// truncate_prompt_tokens (vLLM's): the prompt's last `keep` tokens (-1: the context length).
void truncate_prompt(std::optional<int32_t> keep, int64_t max_model_len,
                     std::vector<TokenId>* tokens) {
  if (!keep) return;
  const int64_t k = *keep < 0 ? max_model_len : *keep;
  if (static_cast<int64_t>(tokens->size()) > k) tokens->erase(tokens->begin(), tokens->end() - k);
}

// Tokens to stop tokenizing at: past the context a prompt is refused, unless it is truncated.
size_t tokenize_limit(const CommonRequestFields& fields, int64_t max_model_len) {
  return fields.truncate_prompt_tokens ? 0 : static_cast<size_t>(max_model_len);
}

// The prompt does not fit the context; found while tokenizing, which stops there.
ApiError prompt_too_long(int64_t max_model_len, const char* param) {
  ApiError e;
  e.message = "this model's maximum context length is " + std::to_string(max_model_len) +
              " tokens, and the prompt alone has more; shorten it";
  e.param = param;
  e.code = "context_length_exceeded";
  return e;
}

// Compiles the request's structured output into its sampling constraint; an error to send
// when that cannot be done. The pattern is derived again from `body_text` read with its key
// order kept: a schema's properties then come in the order the client wrote them, as in
// vLLM (the parsed body has its keys sorted).
std::optional<ApiError> attach_structured_output(OpenAiServer::Context& ctx,
                                                 std::string_view body_text,
                                                 CommonRequestFields& fields) {
  if (!fields.structured_output) return std::nullopt;
  const std::optional<nlohmann::ordered_json> ordered =
      ordered_body_members(body_text, kStructuredOutputMembers);
  std::optional<StructuredOutputRequest> in_order;
  if (ordered && !parse_structured_output(*ordered, &in_order) && in_order) {
    fields.structured_output = std::move(in_order);
  }
  const std::string& field = fields.structured_output->field;
  if (ctx.structured_outputs == nullptr) {
    ApiError e;
    e.message = "'" + field +
                "' (structured outputs) needs the model's tokenizer, and this "
                "model has none";
    e.param = field;
    e.code = "unsupported_parameter";
    return e;
  }
  Result<std::shared_ptr<const grammar::TokenConstraint>> constraint =
      ctx.structured_outputs->compile(fields.structured_output->pattern);
  if (!constraint.ok()) {
    ApiError e;
    e.message = "'" + field + "': " + constraint.status().message();
    e.param = field;
    e.code = "invalid_value";
    return e;
  }
  fields.params.sampling.constraint = std::move(constraint).value();
  fields.params.structured_output_pattern = fields.structured_output->pattern;  // for other ranks
  return std::nullopt;
}

// The forced calls' (a named tool_choice, "required") arguments regex per tool, viewing the
// distinct patterns it owns (tools with the same schema share one).
struct ForcedCallTools {
  std::deque<std::string> patterns;  // a deque: growing it moves none, so views stay valid
  std::vector<ToolArgumentsPattern> tools;
  bool any_object_fallback = false;  // every tool takes any JSON object (below)
};

// From `tools` (validated by the request parser): the parameters schema's regex, or any JSON
// object where there is none, the converter cannot express it, or it is not an object's
// (arguments are one JSON object: serve/tool_call_parser.h). A schema without "type" is read
// as an object's: `"parameters": {}` is a function without arguments, not "any value" (whose
// pattern is over the automaton's bounds and took every tool's schema down with it).
// Together the distinct patterns stay within what the automaton accepts at all (a longer
// pattern is refused at once): a few hundred bytes of schema can convert to a regex of nearly
// 1 MiB, and 128 such tools made a pattern of 220 MB. Past that budget every tool takes any
// JSON object, as where the pattern is over the automaton's bounds. With `only`, that tool
// alone (a named tool_choice: the others' schemas are not used).
template <typename Json>
ForcedCallTools tool_arguments_patterns(const Json& tools, const std::optional<std::string>& only) {
  const grammar::JsonRegexOptions options;
  const size_t budget = grammar::RegexLimits{}.max_pattern_bytes;
  ForcedCallTools out;
  std::unordered_set<std::string_view> distinct;
  size_t distinct_bytes = 0;
  std::string_view any_object;  // added once, for the first tool that needs it
  auto any_object_pattern = [&] {
    if (any_object.empty()) {
      any_object = out.patterns.emplace_back(grammar::json_object_regex(options));
    }
    return any_object;
  };
  for (const auto& tool : tools) {
    const auto& function = tool["function"];
    ToolArgumentsPattern entry;
    entry.name = function["name"].template get<std::string>();
    if (only && entry.name != *only) continue;
    const auto parameters = function.find("parameters");
    Result<std::string> converted = invalid_argument("not an object's schema");
    if (parameters != function.end() && parameters->is_object()) {
      const auto type = parameters->find("type");
      if (type == parameters->end()) {
        Json object_schema = *parameters;
        object_schema["type"] = "object";
        converted = grammar::json_schema_to_regex(object_schema, options);
      } else if (*type == "object") {
        converted = grammar::json_schema_to_regex(*parameters, options);
      }
    }
    if (!converted.ok()) {
      entry.arguments = any_object_pattern();
    } else if (const auto seen = distinct.find(*converted); seen != distinct.end()) {
      entry.arguments = *seen;
    } else {
      distinct_bytes += converted->size();
      if (distinct_bytes > budget) {
        out.any_object_fallback = true;
        out.tools.clear();
        out.patterns.clear();
        any_object = {};
        for (const auto& each : tools) {
          std::string name = each["function"]["name"].template get<std::string>();
          if (!only || name == *only) out.tools.push_back({std::move(name), any_object_pattern()});
        }
        return out;
      }
      entry.arguments = out.patterns.emplace_back(std::move(converted).value());
      distinct.insert(entry.arguments);
    }
    out.tools.push_back(std::move(entry));
  }
  return out;
}

// A forced call is decoded under a structured-output constraint, as vLLM does for a named
// tool_choice and "required": the call parses, and its arguments match the function's
// parameters. The tools are the template's (`input`), which kept the key order they were sent
// in, so that arguments keep the schema's property order. A pattern over the automaton's bounds
// falls back to any JSON object as every tool's arguments, and if even that is over them, leaves
// the call unconstrained, as it was before constraints existed (docs/tool_calling.md); both
// are counted in /metrics.
void attach_forced_call_constraint(OpenAiServer::Context& ctx, const ChatTemplateInput& input,
                                   ChatRequest& chat) {
  const bool named = chat.tool_choice.mode == ToolChoice::Mode::kNamed;
  if (ctx.structured_outputs == nullptr ||
      (!named && chat.tool_choice.mode != ToolChoice::Mode::kRequired)) {
    return;
  }
  const std::optional<std::string> function_name =
      named ? std::optional<std::string>(chat.tool_choice.function_name) : std::nullopt;
  const auto sent = input.extra_variables.find("tools");
  const bool in_order =
      sent != input.extra_variables.end() && sent->is_array() && sent->size() == chat.tools.size();
  ForcedCallTools forced = in_order ? tool_arguments_patterns(*sent, function_name)
                                    : tool_arguments_patterns(chat.tools, function_name);
  const bool parallel = !named && chat.parallel_tool_calls;
  std::string pattern = forced_tool_call_pattern(forced.tools, function_name, parallel);
  if (pattern.empty()) return;  // a name not in tools: refused by the request parser
  Result<std::shared_ptr<const grammar::TokenConstraint>> constraint =
      ctx.structured_outputs->compile(pattern);
  if (!constraint.ok()) {
    // Over the automaton's bounds (several large schemas): any JSON object for every tool,
    // which share one copy.
    const std::string any_object = grammar::json_object_regex({});
    for (ToolArgumentsPattern& tool : forced.tools) tool.arguments = any_object;
    pattern = forced_tool_call_pattern(forced.tools, function_name, parallel);
    constraint = ctx.structured_outputs->compile(pattern);
    if (!constraint.ok()) {
      ++ctx.forced_calls_unconstrained;
      return;
    }
    forced.any_object_fallback = true;
  }
  if (forced.any_object_fallback) ++ctx.forced_calls_any_object;
  chat.params.sampling.constraint = std::move(constraint).value();
  chat.params.structured_output_pattern = std::move(pattern);  // for other ranks
}

// vLLM's bad_words, tokenized into the token sequences the sampler bans.
std::optional<ApiError> attach_bad_words(const OpenAiServer::Context& ctx,
                                         CommonRequestFields& fields) {
  if (fields.bad_words.empty()) return std::nullopt;
  if (ctx.tokenizer == nullptr) {
    ApiError e;
    e.message = "'bad_words' needs the model's tokenizer, and this model has none";
    e.param = "bad_words";
    e.code = "unsupported_parameter";
    return e;
  }
  Result<std::vector<std::vector<TokenId>>> ids =
      bad_words_token_ids(*ctx.tokenizer, fields.bad_words);
  if (!ids.ok()) return api_error_from_status(ids.status(), "bad_words");
  fields.params.sampling.bad_words_ids = std::move(ids).value();
  return std::nullopt;
}

// Why a chat request cannot be templated, and what to do about it.
ApiError no_chat_template(const OpenAiServer::Context& ctx) {
  ApiError e;
  if (ctx.tokenizer == nullptr) {
    e.message =
        "this model has no tokenizer, so no chat template; use /v1/completions with "
        "token-id prompts";
  } else if (const Status why = ctx.tokenizer->chat_template_status();
             why.code() != StatusCode::kNotFound && !why.ok()) {
    e.message = "this model's chat template could not be parsed (" + why.message() +
                "); the server's --chat-template FILE replaces it, or use /v1/completions";
  } else {
    e.message =
        "this model has no chat template; the server's --chat-template FILE gives it "
        "one, or use /v1/completions";
  }
  return e;
}

void handle_chat(OpenAiServer::Context& ctx, const HttpRequest& request,
                 std::shared_ptr<HttpExchange> exchange) {
  if (ctx.draining.load()) {
    return send_error(*exchange, api_error_from_status(unavailable(
                                     "the server is shutting down; retry on another instance")));
  }
  auto body = parse_body(ctx, request, *exchange);
  if (!body) return;
  ChatRequest chat;
  if (auto e = parse_chat_request(*body, ctx.options.limits, &chat))
    return send_error(*exchange, *e);
  if (auto e = check_model(ctx, chat.model)) return send_error(*exchange, *e);
  if (auto e = attach_structured_output(ctx, request.body, chat)) return send_error(*exchange, *e);
  if (auto e = attach_bad_words(ctx, chat)) return send_error(*exchange, *e);
  if (ctx.tokenizer == nullptr || ctx.tokenizer->chat_template() == nullptr) {
    return send_error(*exchange, no_chat_template(ctx));
  }
  const bool use_tools = chat.tool_choice.mode != ToolChoice::Mode::kNone;
  if (use_tools && !ctx.options.tool_calling) {
    ApiError e;
    e.message = "tool calling is off on this server (started with --tool-call-parser none)";
    e.param = "tools";
    e.code = "unsupported_parameter";
    return send_error(*exchange, e);
  }
  if (chat.forced_output && !ctx.options.allow_forced_output) {
    ApiError e;
    e.message =
        "'peerserve_forced_output' is a testing hook; this server was not started with "
        "--allow-forced-output";
    e.param = "peerserve_forced_output";
    e.code = "unsupported_parameter";
    return send_error(*exchange, e);
  }
  const ChatTemplateInput input = chat_template_input(request.body, chat);
  const int64_t max_len = ctx.engine->options().scheduler.max_model_len;
  Result<std::vector<TokenId>> tokens =
      ctx.tokenizer->encode_chat(input, tokenize_limit(chat, max_len));
  if (tokens.status().code() == StatusCode::kOutOfRange) {
    return send_error(*exchange, prompt_too_long(max_len, "messages"));
  }
  if (!tokens.ok()) {
    ApiError e = api_error_from_status(tokens.status(), "messages");
    if (tokens.status().code() != StatusCode::kResourceExhausted) e.status = 400;
    e.message = "the chat template failed on these messages: " + tokens.status().message();
    return send_error(*exchange, e);
  }
  attach_forced_call_constraint(ctx, input, chat);
  ToolCallSetup tool_setup;
  if (use_tools) {
    tool_setup.enabled = true;
    const bool named = chat.tool_choice.mode == ToolChoice::Mode::kNamed;
    tool_setup.max_calls = named || !chat.parallel_tool_calls ? 1 : 0;
    // "required" and a named function: the answer starts inside a call, so it makes one.
    if (named || chat.tool_choice.mode == ToolChoice::Mode::kRequired) {
      tool_setup.prefix = forced_tool_call_prefix(
          named ? std::optional<std::string>(chat.tool_choice.function_name) : std::nullopt);
    }
  }
  // Tokens of text the server itself adds (the forced call prefix, the forced output):
  // marker strings become their tokens.
  auto encode_markup = [&](const std::string& text) {
    EncodeOptions options;
    options.add_special_tokens = false;
    options.max_tokens = static_cast<size_t>(max_len);
    return ctx.tokenizer->encode(text, options);
  };
  std::vector<TokenId> prompt = std::move(tokens).value();
  truncate_prompt(chat.truncate_prompt_tokens, max_len, &prompt);
  if (!tool_setup.prefix.empty()) {
    Result<std::vector<TokenId>> prefix = encode_markup(tool_setup.prefix);
    if (!prefix.ok())
      return send_error(*exchange, api_error_from_status(prefix.status(), "tool_choice"));
    prompt.insert(prompt.end(), prefix->begin(), prefix->end());
  }
  if (chat.forced_output) {
    Result<std::vector<TokenId>> forced = encode_markup(*chat.forced_output);
    if (!forced.ok()) {
      ApiError e = api_error_from_status(forced.status(), "peerserve_forced_output");
      e.status = 400;
      return send_error(*exchange, e);
    }
    chat.params.sampling.forced_tokens = std::move(forced).value();
  }
  const int32_t top = chat.params.sampling.top_logprobs;
  auto call = std::make_shared<GenerationCall>(&ctx, exchange, /*chat=*/true, chat, top,
                                               std::move(tool_setup));
  std::vector<EngineRequest> requests(1);
  requests[0].prompt_tokens = std::move(prompt);
  requests[0].params = chat.params;
  requests[0].prefill_hint = chat.prefill_hint;
  requests[0].cache_salt = chat.cache_salt;
  start_on_strand(call, exchange, std::move(requests));
}

void handle_completion(OpenAiServer::Context& ctx, const HttpRequest& request,
                       std::shared_ptr<HttpExchange> exchange) {
  if (ctx.draining.load()) {
    return send_error(*exchange, api_error_from_status(unavailable(
                                     "the server is shutting down; retry on another instance")));
  }
  auto body = parse_body(ctx, request, *exchange);
  if (!body) return;
  CompletionRequest completion;
  if (auto e = parse_completion_request(*body, ctx.options.limits, &completion)) {
    return send_error(*exchange, *e);
  }
  if (auto e = check_model(ctx, completion.model)) return send_error(*exchange, *e);
  if (auto e = attach_structured_output(ctx, request.body, completion))
    return send_error(*exchange, *e);
  if (auto e = attach_bad_words(ctx, completion)) return send_error(*exchange, *e);
  if (!completion.expected_kv_namespace.empty() &&
      completion.expected_kv_namespace != ctx.options.kv_namespace_identity) {
    // A decode instance handing this server a prompt expects KV of its own namespace.
    ApiError e;
    e.status = 409;
    e.message =
        "this server's KV namespace is '" +
        (ctx.options.kv_namespace_identity.empty() ? std::string("(none: serve with --kv-pool)")
                                                   : ctx.options.kv_namespace_identity) +
        "', the request expects '" + completion.expected_kv_namespace + "'";
    e.param = "peerserve_kv_namespace";
    e.code = "kv_namespace_mismatch";
    return send_error(*exchange, e);
  }
  if (completion.kv_push && !ctx.options.accept_kv_push) {
    ApiError e;
    e.message =
        "'peerserve_kv_push' is for prefill instances (serve --role prefill); this server does "
        "not push KV";
    e.param = "peerserve_kv_push";
    e.code = "unsupported_parameter";
    return send_error(*exchange, e);
  }
  if (completion.echo && ctx.tokenizer == nullptr) {
    ApiError e;
    e.message = "'echo' needs the prompt's text, and this model has no tokenizer";
    e.param = "echo";
    return send_error(*exchange, e);
  }
  PromptEcho echo;
  echo.enabled = completion.echo;
  echo.prompt_only = completion.echo_only;
  std::vector<EngineRequest> requests;
  const int64_t max_len = ctx.engine->options().scheduler.max_model_len;
  for (auto& prompt : completion.prompts) {
    EngineRequest r;
    r.params = completion.params;
    r.kv_push = completion.kv_push;
    r.prefill_hint = completion.prefill_hint;
    r.cache_salt = completion.cache_salt;
    const std::string* text = std::get_if<std::string>(&prompt);
    if (text == nullptr) {
      r.prompt_tokens = std::move(std::get<std::vector<TokenId>>(prompt));
    } else {
      if (ctx.tokenizer == nullptr) {
        ApiError e;
        e.message = "this model has no tokenizer; send the prompt as token ids";
        e.param = "prompt";
        return send_error(*exchange, e);
      }
      Result<std::vector<TokenId>> encoded =
          ctx.tokenizer->encode(*text, {.add_special_tokens = completion.add_special_tokens,
                                        .max_tokens = tokenize_limit(completion, max_len)});
      if (encoded.status().code() == StatusCode::kOutOfRange) {
        return send_error(*exchange, prompt_too_long(max_len, "prompt"));
      }
      if (!encoded.ok()) {
        return send_error(*exchange, api_error_from_status(encoded.status(), "prompt"));
      }
      r.prompt_tokens = std::move(encoded).value();
    }
    const size_t before = r.prompt_tokens.size();
    truncate_prompt(completion.truncate_prompt_tokens, max_len, &r.prompt_tokens);
    if (echo.enabled) {
      if (text != nullptr && r.prompt_tokens.size() == before) {
        const std::optional<TokenId> bos = ctx.tokenizer->bos_id();
        const bool bos_added = completion.add_special_tokens && ctx.tokenizer->add_bos_token() &&
                               bos && !r.prompt_tokens.empty() && r.prompt_tokens.front() == *bos;
        echo.first_token_in_text.push_back(bos_added ? 0 : 1);
        echo.texts.push_back(*text);
      } else {
        // Token ids (or what truncation kept) as text, special tokens included (vLLM's).
        Result<std::string> decoded = ctx.tokenizer->decode(r.prompt_tokens);
        if (!decoded.ok()) {
          return send_error(*exchange, api_error_from_status(decoded.status(), "prompt"));
        }
        echo.first_token_in_text.push_back(1);  // decoded with its special tokens
        echo.texts.push_back(std::move(decoded).value());
      }
    }
    requests.push_back(std::move(r));
  }
  const int32_t top = completion.params.sampling.top_logprobs;
  auto call = std::make_shared<GenerationCall>(&ctx, exchange, /*chat=*/false, completion, top,
                                               ToolCallSetup{}, std::move(echo));
  start_on_strand(call, exchange, std::move(requests));
}

json model_card(const OpenAiServer::Context& ctx) {
  json card = {{"id", ctx.options.served_model_name},
               {"object", "model"},
               {"created", unix_seconds()},
               {"owned_by", "peerserve"},
               {"root", ctx.options.served_model_name},
               {"max_model_len", ctx.engine->options().scheduler.max_model_len}};
  if (!ctx.options.kv_namespace_identity.empty()) {
    // What a peer must agree with to use this instance's KV (the disaggregation handshake).
    card["peerserve"] = {{"kv_namespace", ctx.options.kv_namespace_identity}};
  }
  return card;
}

// The optional 'model' of /tokenize and /detokenize: absent, null or a string.
std::optional<ApiError> optional_model_name(const json& body, std::optional<std::string>* model) {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    ApiError e;
    e.message = "'model' must be a string, got " + std::string(it->type_name());
    e.param = "model";
    return e;
  }
  *model = it->get<std::string>();
  return std::nullopt;
}

// An optional boolean field of /tokenize: `value` keeps its default when the field is absent.
std::optional<ApiError> optional_boolean(const json& body, const char* name, bool* value) {
  const auto it = body.find(name);
  if (it == body.end()) return std::nullopt;
  if (!it->is_boolean()) {
    ApiError e;
    e.message = "'" + std::string(name) + "' must be a boolean";
    e.param = name;
    return e;
  }
  *value = it->get<bool>();
  return std::nullopt;
}

void handle_tokenize(OpenAiServer::Context& ctx, const HttpRequest& request,
                     std::shared_ptr<HttpExchange> exchange) {
  auto body = parse_body(ctx, request, *exchange);
  if (!body) return;
  ApiError e;
  if (!body->is_object()) {
    e.message = "the request body must be a JSON object";
    return send_error(*exchange, e);
  }
  std::optional<std::string> model;
  if (auto bad = optional_model_name(*body, &model)) return send_error(*exchange, *bad);
  if (auto me = check_model(ctx, model)) return send_error(*exchange, *me);
  if (ctx.tokenizer == nullptr) {
    e.message = "this model has no tokenizer";
    return send_error(*exchange, e);
  }
  bool return_token_strs = false;
  if (auto bad = optional_boolean(*body, "return_token_strs", &return_token_strs)) {
    return send_error(*exchange, *bad);
  }
  Result<std::vector<TokenId>> tokens = std::vector<TokenId>{};
  if (body->contains("messages")) {
    ChatRequest chat;
    json chat_body = {{"messages", (*body)["messages"]}};
    // What shapes the chat request's prompt shapes this one (vLLM's TokenizeChatRequest), so
    // the two counts agree.
    for (const char* key : {"add_generation_prompt", "continue_final_message", "tools",
                            "tool_choice", "chat_template_kwargs", "add_special_tokens"}) {
      if (body->contains(key)) chat_body[key] = (*body)[key];
    }
    if (auto pe = parse_chat_request(chat_body, ctx.options.limits, &chat)) {
      return send_error(*exchange, *pe);
    }
    if (ctx.tokenizer->chat_template() == nullptr) {
      return send_error(*exchange, no_chat_template(ctx));
    }
    tokens = ctx.tokenizer->encode_chat(chat_template_input(request.body, chat));
  } else if (body->contains("prompt") && (*body)["prompt"].is_string()) {
    bool add_special = true;
    if (auto bad = optional_boolean(*body, "add_special_tokens", &add_special)) {
      return send_error(*exchange, *bad);
    }
    tokens = ctx.tokenizer->encode((*body)["prompt"].get<std::string>(),
                                   {.add_special_tokens = add_special, .match_added_tokens = true});
  } else {
    e.message = "'prompt' (a string) or 'messages' is required";
    e.param = "prompt";
    return send_error(*exchange, e);
  }
  if (!tokens.ok()) return send_error(*exchange, api_error_from_status(tokens.status()));
  json response = {{"count", tokens->size()},
                   {"max_model_len", ctx.engine->options().scheduler.max_model_len},
                   {"tokens", *tokens}};
  if (return_token_strs) {  // as written in tokenizer.json (vLLM: convert_ids_to_tokens)
    json strs = json::array();
    for (const TokenId id : *tokens) strs.push_back(sanitize_utf8(ctx.tokenizer->token_text(id)));
    response["token_strs"] = std::move(strs);
  }
  exchange->respond(200, kJson, response.dump());
}

void handle_detokenize(OpenAiServer::Context& ctx, const HttpRequest& request,
                       std::shared_ptr<HttpExchange> exchange) {
  auto body = parse_body(ctx, request, *exchange);
  if (!body) return;
  ApiError e;
  e.param = "tokens";
  if (!body->is_object() || !body->contains("tokens") || !(*body)["tokens"].is_array()) {
    e.message = "'tokens' (an array of token ids) is required";
    return send_error(*exchange, e);
  }
  std::optional<std::string> model;
  if (auto bad = optional_model_name(*body, &model)) return send_error(*exchange, *bad);
  if (auto me = check_model(ctx, model)) return send_error(*exchange, *me);
  if (ctx.tokenizer == nullptr) {
    e.message = "this model has no tokenizer";
    return send_error(*exchange, e);
  }
  std::vector<TokenId> ids;  // range-checked: get<TokenId>() wrapped 4294967297 to 1
  if (auto bad = parse_token_ids((*body)["tokens"], "tokens", &ids)) {
    return send_error(*exchange, *bad);
  }
  Result<std::string> text = ctx.tokenizer->decode(ids);
  if (!text.ok()) return send_error(*exchange, api_error_from_status(text.status(), "tokens"));
  exchange->respond(200, kJson, json{{"prompt", sanitize_utf8(*text)}}.dump());
}

bool authorized(const OpenAiServer::Context& ctx, const HttpRequest& request) {
  return !ctx.options.api_key || bearer_token_matches(request, *ctx.options.api_key);
}

using RouteHandler = void (*)(OpenAiServer::Context&, const HttpRequest&,
                              std::shared_ptr<HttpExchange>);

// Hands a request with a body to the workers (parsing, templating and tokenizing happen
// there, not on the event loop), within the bound on request bytes in flight.
void prepare_off_loop(OpenAiServer::Context& ctx, RouteHandler handler, HttpRequest request,
                      std::shared_ptr<HttpExchange> exchange) {
  const uint64_t bytes = request.body.size();
  const uint64_t before = ctx.inflight_bytes.fetch_add(bytes);
  auto busy = [&](const std::string& why) {
    ctx.inflight_bytes.fetch_sub(bytes);
    ApiError e = api_error_from_status(unavailable(why));
    exchange->respond(e.status, kJson, api_error_json(e), {{"Retry-After", "1"}});
  };
  if (before > 0 && before + bytes > ctx.options.max_inflight_request_bytes) {
    return busy("the server is busy: " + std::to_string(before) +
                " bytes of requests are waiting to be processed (--max-inflight-request-bytes " +
                std::to_string(ctx.options.max_inflight_request_bytes) + "); retry");
  }
  auto task = [&ctx, handler, bytes, request = std::move(request), exchange]() mutable {
    // An exception here would end the worker thread and the process with it.
    try {
      handler(ctx, request, exchange);
    } catch (const std::exception& e) {
      exchange->fail(e.what());
    } catch (...) {
      exchange->fail("an exception that is not a std::exception");
    }
    request = HttpRequest{};  // the body is freed before it stops counting
    ctx.inflight_bytes.fetch_sub(bytes);
  };
  if (!ctx.workers->submit(std::move(task))) {
    return busy("the server is busy: too many requests are waiting to be processed; retry");
  }
}

void route(OpenAiServer::Context& ctx, HttpRequest request,
           std::shared_ptr<HttpExchange> exchange) {
  const std::string path = request.path();
  const std::string& method = request.method;
  if (path.rfind("/v1/", 0) == 0 && !authorized(ctx, request)) {
    return exchange->respond(401, kJson, api_error_json(missing_api_key_error()),
                             {{"WWW-Authenticate", "Bearer"}});
  }
  struct Route {
    const char* path;
    const char* method;
    RouteHandler handler;
  };
  static const Route kRoutes[] = {
      {"/v1/chat/completions", "POST", handle_chat},
      {"/v1/completions", "POST", handle_completion},
      {"/tokenize", "POST", handle_tokenize},
      {"/detokenize", "POST", handle_detokenize},
      {"/v1/models", "GET",
       [](OpenAiServer::Context& c, const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
         json list = {{"object", "list"}, {"data", json::array({model_card(c)})}};
         ex->respond(200, kJson, list.dump());
       }},
      {"/health", "GET",
       [](OpenAiServer::Context& c, const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
         if (c.draining.load()) {
           send_error(*ex, api_error_from_status(unavailable("the server is draining")));
         } else if (c.engine->running()) {
           ex->respond(200, kJson, "{\"status\":\"ok\"}");
         } else {
           send_error(*ex, api_error_from_status(unavailable("the engine is not running")));
         }
       }},
      {"/version", "GET",
       [](OpenAiServer::Context&, const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
         ex->respond(200, kJson, json{{"version", PEERSERVE_VERSION}}.dump());
       }},
      {"/metrics", "GET",
       [](OpenAiServer::Context& c, const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
         const HttpServerCounters http = c.http ? c.http->counters() : HttpServerCounters{};
         std::string body =
             render_server_metrics(c.engine->metrics(), http, c.options.served_model_name);
         body += render_forced_tool_call_fallbacks(
             c.forced_calls_any_object, c.forced_calls_unconstrained, c.options.served_model_name);
         if (c.options.extra_metrics) body += c.options.extra_metrics();
         ex->respond(200, "text/plain; version=0.0.4; charset=utf-8", body);
       }},
  };
  const bool get_or_head = method == "GET" || method == "HEAD";  // HEAD: GET without body
  for (const Route& r : kRoutes) {
    if (path != r.path) continue;
    const bool is_get = std::string_view(r.method) == "GET";
    if (method != r.method && !(is_get && get_or_head)) {
      const std::string allowed = is_get ? "GET, HEAD" : r.method;
      ApiError e;
      e.status = 405;
      e.message = "method " + method + " is not allowed on " + path + "; use " + allowed;
      e.code = "method_not_allowed";
      exchange->respond(405, kJson, api_error_json(e), {{"Allow", allowed}});
      return;
    }
    if (std::string_view(r.method) != "POST") return r.handler(ctx, request, std::move(exchange));
    return prepare_off_loop(ctx, r.handler, std::move(request), std::move(exchange));
  }
  const std::string prefix = "/v1/models/";
  if (get_or_head && path.rfind(prefix, 0) == 0) {
    const std::string name = path.substr(prefix.size());
    if (auto e = check_model(ctx, name)) return send_error(*exchange, *e);
    return exchange->respond(200, kJson, model_card(ctx).dump());
  }
  send_error(*exchange, not_found_route(request));
}

}  // namespace

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::create(const OpenAiServerOptions& options,
                                                           EngineClient* engine,
                                                           const Tokenizer* tokenizer) {
  if (engine == nullptr) return invalid_argument("OpenAI server: no engine");
  if (options.served_model_name.empty()) {
    return invalid_argument("--served-model-name must not be empty");
  }
  auto context = std::make_shared<Context>();
  context->options = options;
  context->engine = engine;
  context->tokenizer = tokenizer;
  if (tokenizer != nullptr) {
    context->structured_outputs =
        std::make_unique<StructuredOutputCompiler>(*tokenizer, engine->options().eos_token_ids);
  }
  const int threads = options.request_threads > 0 ? options.request_threads
                                                  : std::clamp(available_cpus() / 2, 1, 4);
  context->workers = std::make_unique<RequestWorkers>(threads, /*max_queued=*/4096);
  Context* raw = context.get();
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<HttpServer> http,
      HttpServer::create(options.http,
                         [raw](HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
                           route(*raw, std::move(request), std::move(exchange));
                         }));
  context->http = http.get();
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(context), std::move(http)));
}

OpenAiServer::OpenAiServer(std::shared_ptr<Context> context, std::unique_ptr<HttpServer> http)
    : context_(std::move(context)), http_(std::move(http)) {}

void OpenAiServer::begin_drain() {
  context_->draining.store(true);
}

int64_t OpenAiServer::active_generations() const {
  return context_->active_calls.load();
}

OpenAiServer::~OpenAiServer() {
  // The workers finish first (their answers go to connections of the HTTP server), then the
  // HTTP server and its connections, which point into the context.
  context_->workers.reset();
  http_.reset();
}

}  // namespace peerserve
