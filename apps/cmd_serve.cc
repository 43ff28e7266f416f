// peerserve serve: the OpenAI-compatible server, everything in one process (the embedded
// default): model + paged KV cache + engine thread + asynchronous HTTP front end.
#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "apps/attention_form_option.h"
#include "apps/byte_size.h"
#include "apps/command_registry.h"
#include "apps/ep_options.h"
#include "apps/kv_pool_options.h"
#include "apps/load_progress_bar.h"
#include "apps/non_empty_validator.h"
#include "apps/quantize_options.h"
#include "apps/serve_router_role.h"
#include "apps/server_signals.h"
#include "apps/speculative_options.h"
#include "apps/threads_option.h"
#include "apps/tokenizer_gaps.h"
#include "apps/whole_number_validator.h"
#include "base/regular_file.h"
#include "cache/block_stream_server.h"
#include "cache/model_cache.h"
#include "cache/pool_client.h"
#include "model/checkpoint_fingerprint.h"
#include "model/deepseek_model.h"
#include "model/expert_load_recorder.h"
#include "plan/analytic/connection_mapping.h"
#include "runtime/data_parallel_router.h"
#include "runtime/engine.h"
#include "runtime/kv_handoff_receiver.h"
#include "runtime/model_executor.h"
#include "serve/generation_defaults.h"
#include "serve/openai_server.h"
#include "serve/prefill_dispatcher.h"
#include "serve/prometheus_text.h"
#include "serve/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct ServeCli {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_prefill_chunk_tokens = 0;
  std::string kv_cache_memory = "512MiB";
  std::string api_key;
  int64_t max_model_len = 0;
  int block_size = 16;
  int max_waiting_requests = 4096;
  uint64_t max_body_bytes = 8u << 20;
  int threads = 0;
  bool no_prefix_caching = false;
  bool fp32 = false;
  uint64_t seed = 0;
  int microbatches = 1;
  std::string microbatch_split = "measured";
  EpCli ep;
  QuantizeCli quantize;
  std::string attention_form = "auto";
  SpeculativeCli speculative;
  KvPoolCli kv_pool;
  std::string role = "all";
  int shutdown_timeout = 30;
  int max_connections = 4096;
  int max_connections_per_client = 1024;
  int header_timeout = 10;
  int idle_timeout = 30;
  std::string max_unsent = "8MiB";
  std::string max_inflight_request = "256MiB";
  std::string prefill_instances;
  int prefill_timeout_ms = 120000;
  int kv_handoff_port = 0;
  std::string kv_handoff_host;
  std::string decode_instances;
  std::string model_cache;
  std::string model_cache_id;
  int router_connect_timeout_ms = 2000;
  int router_read_timeout_s = 300;
  int health_check_interval_ms = 1000;
  std::string chat_template;
  std::string tool_call_parser = "deepseek_v3";
  bool enable_auto_tool_choice = false;
  bool allow_forced_output = false;
  std::string generation_config = "auto";
  // The serve command, to tell which flags were given (set at registration).
  const CLI::App* command = nullptr;
};

// The first flag given on the command line that `allowed` refuses, or empty. A flag of
// another role would be ignored: it is an error instead.
std::string flag_of_another_role(const ServeCli& cli,
                                 const std::function<bool(const std::string&)>& allowed) {
  if (cli.command == nullptr) return {};
  for (const CLI::Option* option : cli.command->get_options()) {
    const std::string name = option->get_name();
    if (option->count() > 0 && name.rfind("--", 0) == 0 && !allowed(name)) return name;
  }
  return {};
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// --chat-template FILE, read and parsed before the model loads so that a bad file fails
// fast.
Result<std::optional<ChatTemplate>> load_chat_template_file(const std::string& path) {
  if (path.empty()) return std::optional<ChatTemplate>();
  // A file or a pipe (as with <(...)). A directory read as an empty template, which every
  // chat request then failed on; a device is no template.
  PS_ASSIGN_OR_RETURN(TextPrefix source,
                      read_text_file_or_pipe(path, "--chat-template " + path, 1 << 20));
  if (source.more) return invalid_argument("--chat-template " + path + ": larger than 1 MiB");
  Result<ChatTemplate> parsed = ChatTemplate::parse(source.text);
  if (!parsed.ok()) return parsed.status().with_context("--chat-template " + path);
  return std::optional<ChatTemplate>(std::move(parsed).value());
}

// The checkpoint folder's name ("models/peerserve-dsv3-smoke/" -> "peerserve-dsv3-smoke").
std::string default_model_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return kExitFailure;
}

// Ranks other than 0 of `serve --ep N`: no HTTP; the engine runs the requests rank 0 hands
// it until rank 0 stops the group (exit 0) or the group breaks (the error ends the job).
// Signals stay blocked here: mpirun forwards them to rank 0 too, which stops the group.
int follow_leader(EpSession& session, Engine& engine, DataParallelRouter& router) {
  engine.start();
  std::fprintf(stderr, "expert parallelism: rank %d of %d runs the requests rank 0 hands it\n",
               session.rank(), session.size());
  std::fflush(stderr);
  const Status status = router.wait_until_done();
  engine.stop();
  if (!status.ok()) return session.fail(status);
  return 0;
}

int run_router(const ServeCli& cli) {
  if (!cli.model_dir.empty() || !cli.kv_pool.members.empty() || !cli.model_cache.empty()) {
    return fail(invalid_argument(
        "--role router loads no model and uses no pool: drop --model, --model-cache and "
        "--kv-pool (give them to the decode instances)"));
  }
  const std::string engine_flag = flag_of_another_role(cli, [](const std::string& name) {
    return is_one_of(name, {"--role", "--host", "--port", "--api-key", "--decode", "--prefill",
                            "--max-body-bytes", "--max-connections", "--max-connections-per-client",
                            "--http-header-timeout", "--http-idle-timeout", "--max-unsent-bytes",
                            "--shutdown-timeout", "--router-connect-timeout-ms",
                            "--router-read-timeout-s", "--health-check-interval-ms"});
  });
  if (!engine_flag.empty()) {
    return fail(invalid_argument(engine_flag +
                                 " is not for --role router (it runs no engine); give it to the "
                                 "instances behind the router"));
  }
  if (cli.port < 0 || cli.port > 65535) {
    return fail(invalid_argument("--port " + std::to_string(cli.port) + ": expected 0..65535"));
  }
  RouterRoleOptions options;
  options.decode_instances = cli.decode_instances;
  options.prefill_instances = cli.prefill_instances;
  options.http.host = cli.host;
  options.http.port = static_cast<uint16_t>(cli.port);
  options.http.max_body_bytes = cli.max_body_bytes;
  options.http.max_connections = cli.max_connections;
  options.http.max_connections_per_client = cli.max_connections_per_client;
  options.http.header_timeout_seconds = cli.header_timeout;
  options.http.idle_timeout_seconds = cli.idle_timeout;
  const Result<uint64_t> max_unsent = parse_byte_size("--max-unsent-bytes", cli.max_unsent);
  if (!max_unsent.ok()) return fail(max_unsent.status());
  options.http.max_unsent_bytes = *max_unsent;
  if (!cli.api_key.empty()) options.api_key = cli.api_key;
  options.connect_timeout_ms = cli.router_connect_timeout_ms;
  options.read_timeout_s = cli.router_read_timeout_s;
  options.health_interval_ms = cli.health_check_interval_ms;
  options.shutdown_timeout_s = cli.shutdown_timeout;
  return run_router_role(options);
}

int run_serve(const ServeCli& cli) {
  if (cli.role == "router") return run_router(cli);
  if (!cli.decode_instances.empty()) {
    return fail(invalid_argument("--decode is for --role router"));
  }
  const std::string other_role_flag = flag_of_another_role(cli, [&cli](const std::string& name) {
    if (is_one_of(name, {"--router-connect-timeout-ms", "--router-read-timeout-s",
                         "--health-check-interval-ms"})) {
      return false;
    }
    return cli.role == "decode" ||
           !is_one_of(name, {"--prefill-timeout-ms", "--kv-handoff-port", "--kv-handoff-host"});
  });
  if (!other_role_flag.empty()) {
    return fail(
        invalid_argument(other_role_flag + " is not for --role " + cli.role + " (see --help)"));
  }
  // Whatever the flags alone can tell, before the model loads (minutes for a real one).
  if (cli.role != "all" && cli.kv_pool.members.empty()) {
    return fail(invalid_argument("--role " + cli.role +
                                 " needs --kv-pool (the KV hand-off goes through it)"));
  }
  if (!cli.prefill_instances.empty() && cli.role != "decode") {
    return fail(invalid_argument("--prefill is for --role decode"));
  }
  if (cli.role == "decode" && cli.prefill_instances.empty()) {
    return fail(invalid_argument("--role decode needs --prefill HOST:PORT,..."));
  }
  if (Status s = check_speculative_flags(cli.speculative); !s.ok()) return fail(s);
  if (Status s = check_kv_pool_flags(cli.kv_pool); !s.ok()) return fail(s);
  if (cli.model_dir.empty()) return fail(invalid_argument("--model DIR is required"));
  // Signals are taken by a dedicated thread with sigwait(); block them everywhere else
  // (threads created from here on inherit the mask). Until it serves, one ends the process.
  const sigset_t signals = block_server_signals();
  StartupSignalExit startup_exit(signals);

  auto started = EpSession::start(cli.ep);
  if (!started.ok()) return EpSession::report_start_error(started.status());
  EpSession& session = **started;  // outlives the engine, whose lock-step calls it

  const Result<uint64_t> kv_bytes = parse_byte_size("--kv-cache-memory", cli.kv_cache_memory);
  if (!kv_bytes.ok()) return fail(kv_bytes.status());
  // The other sizes too (read again where they are used, after the load).
  for (const auto& [flag, value] :
       {std::pair{"--max-unsent-bytes", &cli.max_unsent},
        std::pair{"--max-inflight-request-bytes", &cli.max_inflight_request}}) {
    if (Result<uint64_t> bytes = parse_byte_size(flag, *value); !bytes.ok()) {
      return session.fail(bytes.status(), true);
    }
  }
  if (cli.port < 0 || cli.port > 65535) {
    return session.fail(
        invalid_argument("--port " + std::to_string(cli.port) + ": expected 0..65535"), true);
  }
  // A bad --host or a port in use, found before the model loads (rank 0 serves the API).
  if (session.leader()) {
    if (Status s = check_listen_address(cli.host, cli.port); !s.ok()) return session.fail(s);
  }
  if (cli.max_num_batched_tokens < cli.max_num_seqs) {
    // Each running sequence needs a token of the step's budget; with fewer, the newest ones
    // would hold their KV and get nothing until older ones finish. vLLM refuses it too.
    return session.fail(
        invalid_argument("--max-num-batched-tokens " + std::to_string(cli.max_num_batched_tokens) +
                         " is below --max-num-seqs " + std::to_string(cli.max_num_seqs) +
                         ": every running sequence needs a token per step"),
        true);
  }

  Result<std::optional<ChatTemplate>> chat_template = load_chat_template_file(cli.chat_template);
  if (!chat_template.ok()) return session.fail(chat_template.status(), true);

  // Model caching (paper 000 §4.4.1): without the checkpoint here, fetch it from the pool;
  // with it, publish it there after loading (below) for the engines that come later.
  std::unique_ptr<PoolClient> model_cache;
  std::string model_cache_id;
  bool fetched_from_cache = false;
  if (!cli.model_cache.empty()) {
    if (session.distributed()) {
      return session.fail(
          invalid_argument("--model-cache with --ep is not supported yet (every rank would "
                           "fetch into the same folder); fetch with one process first"),
          true);
    }
    auto pool = PoolClient::connect(cli.model_cache, {});
    if (!pool.ok()) return session.fail(pool.status().with_context("--model-cache"), true);
    model_cache = std::move(pool).value();
    model_cache_id =
        cli.model_cache_id.empty() ? default_model_name(cli.model_dir) : cli.model_cache_id;
    if (!std::filesystem::exists(std::filesystem::path(cli.model_dir) / "config.json")) {
      std::fprintf(stderr, "model cache: %s has no checkpoint; fetching model '%s' from %s\n",
                   cli.model_dir.c_str(), model_cache_id.c_str(), cli.model_cache.c_str());
      auto fetched = fetch_model(*model_cache, model_cache_id, cli.model_dir);
      if (!fetched.ok()) return session.fail(fetched.status(), true);
      std::fprintf(stderr, "model cache: fetched %lld files (%.2f GB) in %.2f s (%.2f GB/s)\n",
                   static_cast<long long>(fetched->files),
                   static_cast<double>(fetched->bytes) / 1e9, fetched->seconds,
                   static_cast<double>(fetched->bytes) / 1e9 / std::max(fetched->seconds, 1e-9));
      fetched_from_cache = true;
    }
  }
  // After a fetch from the model cache, which may create it; said before "loading".
  if (Status s = require_directory(cli.model_dir, "the model folder"); !s.ok()) {
    return session.fail(s, true);
  }
  // The checkpoint's recommended sampling, as vLLM's --generation-config auto: read (and
  // checked) before the minutes of loading.
  GenerationDefaults generation_defaults;
  if (cli.generation_config == "auto") {
    Result<GenerationDefaults> defaults = load_generation_defaults(cli.model_dir);
    if (!defaults.ok()) return session.fail(defaults.status(), true);
    generation_defaults = *defaults;
    if (!generation_defaults.empty()) {
      std::fprintf(stderr,
                   "sampling defaults from the checkpoint's generation_config.json: %s (for "
                   "OpenAI's defaults instead: --generation-config vllm)\n",
                   generation_defaults.describe().c_str());
    }
  }
  std::fprintf(stderr, "loading %s\n", cli.model_dir.c_str());
  ModelOptions model_options;
  model_options.num_threads = cli.threads;
  model_options.gemm_precision = cli.fp32 ? GemmPrecision::kFp32 : GemmPrecision::kBf16;
  if (Status s = apply_quantize_options(cli.quantize, &model_options); !s.ok()) {
    return session.fail(s, true);
  }
  apply_draft_quantization(cli.speculative, &model_options);
  model_options.attention_form = attention_form_named(cli.attention_form);
  if (Status s = session.plan_experts(cli.model_dir, &model_options); !s.ok()) {
    return session.fail(s, true);
  }
  Result<std::unique_ptr<DeepseekModel>> model =
      load_model_showing_progress(cli.model_dir, model_options);
  if (!model.ok()) return session.fail(model.status());
  const ModelConfig& config = (*model)->config();
  std::thread model_publisher;
  if (model_cache && !fetched_from_cache) {
    model_publisher = std::thread([pool = model_cache.get(), id = model_cache_id,
                                   dir = cli.model_dir] {
      Result<std::string> fingerprint = checkpoint_fingerprint(dir);
      if (!fingerprint.ok()) {
        std::fprintf(stderr, "model cache: not published: %s\n",
                     fingerprint.status().message().c_str());
        return;
      }
      Result<std::string> cached = cached_model_fingerprint(*pool, id);
      if (cached.ok() && *cached == *fingerprint) {
        std::fprintf(stderr, "model cache: model '%s' is already in the pool\n", id.c_str());
        return;
      }
      auto published = publish_model(*pool, id, dir, *fingerprint);
      if (!published.ok()) {
        std::fprintf(stderr, "model cache: publishing '%s' failed: %s\n", id.c_str(),
                     published.status().message().c_str());
        return;
      }
      std::fprintf(stderr, "model cache: published model '%s' (%lld files, %.2f GB) in %.2f s\n",
                   id.c_str(), static_cast<long long>(published->files),
                   static_cast<double>(published->bytes) / 1e9, published->seconds);
    });
  }
  // Joined on every way out of run_serve.
  struct JoinOnExit {
    std::thread& t;
    ~JoinOnExit() {
      if (t.joinable()) t.join();
    }
  } join_publisher{model_publisher};
  if (Status s = session.install(**model, cli.max_num_batched_tokens); !s.ok()) {
    return session.fail(s);
  }
  // Per-expert token counts for /metrics (the load expert placement balances). Under
  // expert parallelism the session counts them for its rebalance instead, and the router
  // brings every rank's counts to rank 0.
  std::shared_ptr<ExpertLoadRecorder> expert_load;
  if (!session.distributed()) {
    expert_load = std::make_shared<ExpertLoadRecorder>(
        (*model)->expert_backend(), config.num_hidden_layers + 1, config.n_routed_experts);
    (*model)->set_expert_backend(expert_load);
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (Result<Tokenizer> tok = Tokenizer::load_from_dir(cli.model_dir); tok.ok()) {
    tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
    if (session.leader()) warn_about_tokenizer_gaps(*tokenizer);
  } else {
    std::fprintf(stderr, "warning: no usable tokenizer (%s); only token-id prompts will work\n",
                 tok.status().message().c_str());
  }
  if (*chat_template) {
    if (!tokenizer)
      return session.fail(invalid_argument("--chat-template needs the model's tokenizer"));
    tokenizer->set_chat_template(std::move(**chat_template));
  } else if (tokenizer && tokenizer->chat_template() == nullptr && session.leader()) {
    const Status why = tokenizer->chat_template_status();
    if (why.code() == StatusCode::kNotFound) {
      std::fprintf(stderr,
                   "note: the model has no chat template: /v1/chat/completions answers 400 "
                   "(--chat-template FILE gives it one)\n");
    } else {
      std::fprintf(stderr,
                   "warning: the model's chat template could not be parsed (%s): "
                   "/v1/chat/completions answers 400 (--chat-template FILE replaces it)\n",
                   why.message().c_str());
    }
  }
  const bool tool_calling = cli.tool_call_parser != "none";
  if (tool_calling && tokenizer && tokenizer->chat_template() &&
      tokenizer->chat_template()->source().find("tools") == std::string::npos) {
    // DeepSeek-V3's own template renders tool calls and results but not the tools offered.
    std::fprintf(stderr,
                 "note: the chat template does not use `tools`: requests with tools are "
                 "answered, but the model is not shown them; pass --chat-template "
                 "data/chat_templates/deepseek_v3_tools.jinja (in the peerserve source tree)\n");
  }

  const DType kv_dtype = cli.fp32 ? DType::kF32 : DType::kBF16;
  const KvLayout layout = (*model)->kv_layout(cli.block_size, kv_dtype);
  if (Status s = layout.validate(); !s.ok()) return fail(s);
  const int64_t num_blocks = kv_blocks_for_memory(layout, *kv_bytes);
  if (num_blocks < 1) {
    return fail(invalid_argument("--kv-cache-memory " + cli.kv_cache_memory +
                                 " holds no KV block; one block needs " +
                                 std::to_string(layout.block_bytes()) + " bytes"));
  }
  ModelExecutorOptions executor_options;
  executor_options.block_size = cli.block_size;
  executor_options.num_blocks = num_blocks;
  executor_options.kv_dtype = kv_dtype;
  executor_options.microbatches = cli.microbatches;
  executor_options.microbatch_split =
      cli.microbatch_split == "always" ? MicrobatchSplit::kAlways : MicrobatchSplit::kMeasured;
  Result<SpeculativeSetting> speculative =
      resolve_speculative_options(cli.speculative, (*model)->has_mtp());
  if (!speculative.ok()) return fail(speculative.status());
  if (speculative->automatic && cli.microbatches != 1) {
    // Its calibration times steps of one microbatch: not what this server runs.
    if (session.leader()) {
      std::fprintf(stderr,
                   "speculative auto: off (its calibration times one-microbatch steps; this "
                   "server runs --microbatches %d: use --speculative mtp to draft)\n",
                   cli.microbatches);
    }
    *speculative = SpeculativeSetting{};
  }
  if (speculative->automatic && session.distributed()) {
    // The calibration times one process's steps; under --ep every step needs every rank.
    if (session.leader()) {
      std::fprintf(stderr, "speculative auto: off under --ep (use --speculative mtp to draft)\n");
    }
    *speculative = SpeculativeSetting{};
  }
  executor_options.num_speculative_tokens = speculative->num_tokens;
  auto executor = ModelExecutor::create(model->get(), executor_options);
  if (!executor.ok()) return fail(executor.status());
  // The executor's cache is the one source of the KV geometry: the scheduler's blocks and
  // the pool's namespace are derived from it (Engine::create checks the block size).
  const KvLayout& kv_geometry = (*executor)->kv_cache().layout();

  EngineOptions engine_options;
  SchedulerOptions& sched = engine_options.scheduler;
  sched.max_num_seqs = cli.max_num_seqs;
  sched.max_num_batched_tokens = cli.max_num_batched_tokens;
  // One request of max_model_len tokens must fit the KV cache (else it could never be
  // admitted). An explicit --max-model-len that does not fit is refused, as vLLM does; the
  // default (the model's max_position_embeddings) is lowered to what fits, and said so.
  const int64_t kv_tokens = num_blocks * cli.block_size;
  if (cli.max_model_len > config.max_position_embeddings) {
    // Positions past it have no rotary embedding: the request would fail in the forward,
    // and every other request of its step with it.
    return fail(invalid_argument("--max-model-len " + std::to_string(cli.max_model_len) +
                                 " is larger than the model's max_position_embeddings " +
                                 std::to_string(config.max_position_embeddings)));
  }
  sched.max_model_len = cli.max_model_len > 0 ? cli.max_model_len : config.max_position_embeddings;
  if (sched.max_model_len > kv_tokens) {
    if (cli.max_model_len > 0) {
      return fail(invalid_argument(
          "--max-model-len " + std::to_string(cli.max_model_len) + " is larger than the " +
          std::to_string(kv_tokens) + " tokens the KV cache holds (--kv-cache-memory " +
          cli.kv_cache_memory + "); raise --kv-cache-memory or lower --max-model-len"));
    }
    std::fprintf(stderr,
                 "note: max_model_len lowered from %lld (the model's max_position_embeddings) "
                 "to %lld, the tokens the KV cache holds (--kv-cache-memory %s)\n",
                 static_cast<long long>(sched.max_model_len), static_cast<long long>(kv_tokens),
                 cli.kv_cache_memory.c_str());
    sched.max_model_len = kv_tokens;
  }
  sched.max_waiting_seqs = cli.max_waiting_requests;
  sched.max_prefill_chunk_tokens = cli.max_prefill_chunk_tokens;  // validated by the scheduler
  sched.num_speculative_tokens = speculative->num_tokens;
  if (speculative->automatic) {
    std::fprintf(stderr, "speculative auto: measuring decode, verification and MTP steps ...\n");
    const std::vector<int32_t> batches = speculative_calibration_batches(cli.max_num_seqs);
    auto costs = (*executor)->measure_speculative_costs(batches, 64, 5);
    if (!costs.ok()) return fail(costs.status());
    const SpeculativePolicy policy = decide_speculative_policy(*costs);
    std::fprintf(stderr, "speculative auto: %s\n", policy.reason.c_str());
    sched.num_speculative_tokens = policy.enabled ? 1 : 0;
    sched.speculative_max_running = policy.max_running;
    sched.speculative_guard_drafts = 256;
    sched.speculative_min_acceptance = policy.break_even_acceptance;
  }
  sched.block_pool.num_blocks =
      static_cast<int32_t>(std::min<int64_t>((*executor)->kv_cache().num_blocks(), INT32_MAX));
  sched.block_pool.block_size = static_cast<int32_t>(kv_geometry.block_size);
  sched.block_pool.enable_prefix_caching = !cli.no_prefix_caching;
  for (const int64_t id : config.eos_token_ids) {
    engine_options.eos_token_ids.push_back(static_cast<TokenId>(id));
  }
  // generation_config.json's end-of-sequence ids end generation too (vLLM adds them as stop
  // ids): a chat model's end-of-turn token is often listed only there.
  for (const int64_t id : generation_defaults.eos_token_ids) {
    if (id >= config.vocab_size) {
      return session.fail(invalid_argument(
          cli.model_dir + "/generation_config.json: eos_token_id " + std::to_string(id) +
          " is not below the vocabulary size " + std::to_string(config.vocab_size)));
    }
    const auto token = static_cast<TokenId>(id);
    if (std::find(engine_options.eos_token_ids.begin(), engine_options.eos_token_ids.end(),
                  token) == engine_options.eos_token_ids.end()) {
      engine_options.eos_token_ids.push_back(token);
    }
  }
  if (engine_options.eos_token_ids.empty() && tokenizer && tokenizer->eos_id()) {
    engine_options.eos_token_ids.push_back(*tokenizer->eos_id());
  }
  engine_options.vocab_size = config.vocab_size;
  engine_options.seed = cli.seed;
  std::string kv_pool_description, kv_identity;
  if (!cli.kv_pool.members.empty()) {
    if (cli.no_prefix_caching) {
      return session.fail(
          invalid_argument("--kv-pool needs prefix caching (drop --no-prefix-caching)"), true);
    }
    // Speculation as configured (mtp or auto), not as auto's calibration came out: two
    // instances of one configuration get one identity on any machine.
    // INT8 at load and fp32 activations compute other KV than the stored weights in BF16:
    // engines that differ in them must not share blocks (they shared one identity).
    std::string compute;
    if (model_options.quantize == WeightQuantization::kInt8) compute = "w8a8";
    if (model_options.gemm_precision == GemmPrecision::kFp32) compute += "+fp32";
    // The MTP layer's KV, stored beside the main layers' when speculating, comes from the
    // drafter's weights: INT8 forms the loaded weights lacked change it.
    if (speculative->num_tokens > 0 && (*model)->draft_layer_requantized()) {
      compute += "+draft-w8a8";
    }
    // INT8 or BF16 expert dispatch rounds what the experts get and return, so the later
    // layers' KV differ from one process's (FP32 dispatch gives its bits).
    if (session.distributed() && cli.ep.dispatch_dtype != "fp32") {
      compute += "+ep-" + cli.ep.dispatch_dtype;
    }
    // A fixed attention form promises logits that do not depend on how a prompt was cut
    // into chunks, so its blocks must come from that form (auto mixes both).
    if (cli.attention_form != "auto") compute += "+attn-" + cli.attention_form;
    KvPoolCli pool_flags = cli.kv_pool;
    if (session.distributed() && pool_flags.members == "local" && !pool_flags.ssd_dir.empty()) {
      // Each rank has its own in-process pool; an SSD tier's folder serves one at a time.
      pool_flags.ssd_dir += "/rank-" + std::to_string(session.rank());
    }
    auto pool =
        open_kv_pool(pool_flags, cli.model_dir, kv_geometry, speculative->num_tokens > 0, compute);
    // Per rank (each connects on its own): an error here is this rank's, said with its rank.
    if (!pool.ok()) return session.fail(pool.status());
    engine_options.kv_pool = pool->store;
    engine_options.kv_pool_options = pool->connector;
    engine_options.kv_pool_store_decode_blocks = cli.kv_pool.store_decode_blocks;
    sched.prefix_root = pool->name_space.root_hash();
    kv_pool_description = pool->description;
    kv_identity = pool->name_space.canonical_identity();
  }
  if (cli.role != "all" && cli.kv_pool.members.empty()) {
    return session.fail(invalid_argument("--role " + cli.role +
                                         " needs --kv-pool (the KV hand-off goes through it)"),
                        true);
  }
  if (!cli.prefill_instances.empty() && cli.role != "decode") {
    return session.fail(invalid_argument("--prefill is for --role decode"), true);
  }
  std::shared_ptr<PrefillDispatcher> prefill;
  std::shared_ptr<KvHandoffReceiver> handoff;
  std::unique_ptr<BlockStreamServer> handoff_server;  // outlives the engine's hand-offs
  if (cli.role == "decode") {
    if (cli.prefill_instances.empty()) {
      return session.fail(invalid_argument("--role decode needs --prefill HOST:PORT,..."), true);
    }
    if (cli.prefill_timeout_ms < 1) {
      return session.fail(
          invalid_argument("--prefill-timeout-ms " + std::to_string(cli.prefill_timeout_ms) +
                           ": expected >= 1"),
          true);
    }
    auto dispatcher =
        PrefillDispatcher::create(cli.prefill_instances, kv_identity,
                                  std::chrono::milliseconds(cli.prefill_timeout_ms), cli.api_key);
    if (!dispatcher.ok()) return session.fail(dispatcher.status(), true);
    std::vector<std::string> unreachable;
    if (Status s = (*dispatcher)->check(&unreachable); !s.ok()) return session.fail(s);
    for (const std::string& u : unreachable) {
      std::fprintf(stderr, "warning: prefill instance %s not reachable yet; will retry\n",
                   u.c_str());
    }
    prefill = std::move(dispatcher).value();
    if (session.distributed()) {
      // Paper 000 §4.3.3: each decode DP rank (TP 1 here) pulls from its own prefill
      // instance, so the ranks' transfers spread evenly over the prefill instances.
      const Result<int> source =
          plan::prefill_source_rank({prefill->size(), 1, session.size()}, 0, session.rank());
      if (source.ok()) {
        prefill->set_preferred(*source);
        std::fprintf(stderr, "rank %d: prompts go first to prefill instance %d of %d (§4.3.3)\n",
                     session.rank(), *source, prefill->size());
      } else {
        std::fprintf(stderr, "rank %d: no §4.3.3 mapping (%s); least-loaded prefill instance\n",
                     session.rank(), source.status().message().c_str());
      }
    }
    engine_options.kv_pool_options.remote_prefill =
        [prefill](std::span<const TokenId> prompt, const KvPushTarget* push,
                  const std::string& hint, const std::string& cache_salt) {
          return prefill->prefill(prompt, push, hint, cache_salt);
        };
    engine_options.kv_pool_options.workers = 8;  // prefills in flight at once
    if (cli.kv_handoff_port < -1 || cli.kv_handoff_port > 65535) {
      return session.fail(
          invalid_argument("--kv-handoff-port " + std::to_string(cli.kv_handoff_port) +
                           ": expected -1 (off), 0 (any free port) or a port"),
          true);
    }
    if (cli.kv_handoff_port >= 0) {
      // The prefill instances push KV straight into the blocks reserved for it (§4.3.3).
      handoff = std::make_shared<KvHandoffReceiver>();
      BlockStreamServerOptions stream;
      stream.host = cli.host;
      // Under the distributed launcher every rank listens: give each its own port.
      stream.port = cli.kv_handoff_port == 0 ? 0 : cli.kv_handoff_port + session.rank();
      stream.io_timeout = std::chrono::milliseconds(10000);
      // A push holds blocks of this instance's KV layout, at most as many as its cache: the
      // pool's generic limits (65,536 keys, 32 MiB blocks) let a stranger make it buffer more.
      stream.limits.max_block_bytes = layout.block_bytes();
      stream.limits.max_keys =
          static_cast<uint32_t>(std::min<int64_t>(num_blocks, stream.limits.max_keys));
      auto listening = BlockStreamServer::start(handoff, stream);
      if (!listening.ok()) return session.fail(listening.status());  // this rank's port
      handoff_server = std::move(listening).value();
      std::string host = cli.kv_handoff_host;
      if (host.empty()) {
        host = cli.host == "0.0.0.0" || cli.host == "::" ? "127.0.0.1" : cli.host;
      }
      if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
      engine_options.kv_pool_options.handoff = handoff;
      engine_options.kv_pool_options.handoff_endpoint =
          host + ":" + std::to_string(handoff_server->port());
    }
  }
  // Under expert parallelism every rank's engine steps whenever any rank has work
  // (data-parallel attention, experts shared by all), and rank 0 answers the API for all of
  // them: the router hands each request to the least loaded rank over the same agreement.
  std::unique_ptr<DataParallelRouter> router;
  if (session.distributed()) {
    // Each agreement also carries the leader's microbatch plan, which every rank follows.
    router = std::make_unique<DataParallelRouter>(
        session.rank(), session.size(),
        [&session, m = model->get(), pipeline = (*executor)->pipeline()](
            int64_t rows, bool stop,
            std::span<const std::byte> mail) -> Result<dist::StepAgreement> {
          PS_ASSIGN_OR_RETURN(
              dist::StepAgreement a,
              session.agree_and_rebalance(*m, rows, stop, mail,
                                          pipeline != nullptr ? pipeline->proposal() : 0));
          if (pipeline != nullptr) pipeline->follow_agreement(a.leader_proposal, a.tokens);
          return a;
        });
    engine_options.lockstep = [r = router.get()](int64_t rows) { return r->lockstep(rows); };
    engine_options.lockstep_broken = [r = router.get()](const Status& why) { r->break_group(why); };
  }
  auto engine = Engine::create(engine_options, std::move(executor).value(), tokenizer.get());
  if (!engine.ok()) return session.fail(engine.status());
  if (router) {
    router->attach(engine->get());
    // Every rank's expert load reaches rank 0's /metrics with its engine's metrics.
    router->set_expert_counts([&session] { return session.expert_load_totals(); });
  }
  // Structured outputs reach other ranks as their pattern; each rank compiles it against its
  // own copy of the vocabulary (the same tokenizer files).
  std::shared_ptr<StructuredOutputCompiler> rank_constraints;
  if (router && tokenizer) {
    rank_constraints =
        std::make_shared<StructuredOutputCompiler>(*tokenizer, engine_options.eos_token_ids);
    router->set_constraint_compiler([rank_constraints](const std::string& pattern) {
      return rank_constraints->compile(pattern);
    });
  }
  if (router && !session.leader()) {
    // A follower keeps the signals blocked while it serves: rank 0 drains and stops the group
    // (a signal to every rank, as systemd sends, must not end a follower mid-drain).
    startup_exit.done();
    return follow_leader(session, **engine, *router);
  }

  OpenAiServerOptions server_options;
  server_options.http.host = cli.host;
  server_options.http.port = static_cast<uint16_t>(cli.port);
  server_options.http.max_body_bytes = cli.max_body_bytes;
  server_options.http.max_connections = cli.max_connections;
  server_options.http.max_connections_per_client = cli.max_connections_per_client;
  server_options.http.header_timeout_seconds = cli.header_timeout;
  server_options.http.idle_timeout_seconds = cli.idle_timeout;
  const Result<uint64_t> max_unsent = parse_byte_size("--max-unsent-bytes", cli.max_unsent);
  if (!max_unsent.ok()) return session.fail(max_unsent.status(), true);
  server_options.http.max_unsent_bytes = *max_unsent;
  const Result<uint64_t> max_inflight =
      parse_byte_size("--max-inflight-request-bytes", cli.max_inflight_request);
  if (!max_inflight.ok()) return session.fail(max_inflight.status(), true);
  server_options.max_inflight_request_bytes = *max_inflight;
  server_options.served_model_name =
      cli.served_model_name.empty() ? default_model_name(cli.model_dir) : cli.served_model_name;
  if (!cli.api_key.empty()) server_options.api_key = cli.api_key;
  server_options.kv_namespace_identity = kv_identity;
  server_options.limits.max_n = engine_options.max_n;
  server_options.limits.sampling_defaults = generation_defaults;
  server_options.tool_calling = tool_calling;
  server_options.allow_forced_output = cli.allow_forced_output;
  server_options.accept_kv_push = cli.role == "prefill";
  if (expert_load) {
    server_options.extra_metrics = [expert_load, name = server_options.served_model_name] {
      return render_expert_load(expert_load->counts(), expert_load->num_experts(), name);
    };
  }
  if (router) {
    server_options.extra_metrics = [r = router.get(), name = server_options.served_model_name,
                                    experts = config.n_routed_experts] {
      const std::vector<int64_t> counts = r->expert_counts();
      return render_data_parallel_load(r->outstanding(), r->routed_total(), name) +
             (counts.empty() ? std::string() : render_expert_load(counts, experts, name));
    };
  }
  if (prefill) {
    // The decode role's per-link figures, next to whatever else this server reports.
    server_options.extra_metrics = [prefill, other = server_options.extra_metrics,
                                    name = server_options.served_model_name] {
      return (other ? other() : std::string()) + prefill->render_metrics(name);
    };
  }
  EngineClient* client = router ? static_cast<EngineClient*>(router.get()) : engine->get();
  auto server = OpenAiServer::create(server_options, client, tokenizer.get());
  if (!server.ok()) return session.fail(server.status());

  (*engine)->start();
  std::fprintf(stderr,
               "KV cache: %lld blocks x %d tokens (%.1f MiB), max_model_len %lld, "
               "max_num_seqs %d, max_num_batched_tokens %d, prefix caching %s\n",
               static_cast<long long>(num_blocks), cli.block_size,
               static_cast<double>(num_blocks * layout.block_bytes()) / (1 << 20),
               static_cast<long long>(sched.max_model_len), cli.max_num_seqs,
               cli.max_num_batched_tokens, cli.no_prefix_caching ? "off" : "on");
  if (!kv_pool_description.empty()) {
    std::fprintf(stderr, "context caching through the %s\n", kv_pool_description.c_str());
  }
  if (cli.role == "prefill") {
    std::fprintf(stderr,
                 "role prefill: computes prompts for decode instances, pushes their KV to the "
                 "instance that asked and stores it in the pool\n");
  } else if (cli.role == "decode" && handoff_server) {
    std::fprintf(stderr,
                 "role decode: prompts missing from the pool are prefilled by %s, which push "
                 "the KV into blocks reserved here (hand-off receiver on %s)\n",
                 cli.prefill_instances.c_str(),
                 engine_options.kv_pool_options.handoff_endpoint.c_str());
  } else if (cli.role == "decode") {
    std::fprintf(stderr,
                 "role decode: prompts missing from the pool are prefilled by %s, then read "
                 "from the pool\n",
                 cli.prefill_instances.c_str());
  }
  if (session.distributed()) {
    std::fprintf(stderr,
                 "expert parallelism: rank 0 of %d (%s dispatch) answers the API and spreads "
                 "requests over the %d ranks\n",
                 session.size(), cli.ep.dispatch_dtype.c_str(), session.size());
  }
  if (sched.num_speculative_tokens > 0 && session.leader()) {
    std::fprintf(
        stderr, "speculative decoding: the MTP layer%s drafts %d token%s per step%s\n",
        (*model)->mtp_runs_int8() ? " (INT8)" : "", sched.num_speculative_tokens,
        sched.num_speculative_tokens > 1 ? "s" : "",
        sched.speculative_max_running > 0
            ? (" while at most " + std::to_string(sched.speculative_max_running) + " sequences run")
                  .c_str()
            : "");
  }
  Engine* engine_ptr = engine->get();
  OpenAiServer* server_ptr = server->get();
  DataParallelRouter* router_ptr = router.get();
  // run() returned / the signal thread is done with the server / the process is torn down.
  struct ShutdownState {
    std::atomic<bool> run_finished{false};
    std::atomic<bool> drained{false};
    std::atomic<bool> torn_down{false};
  };
  auto state = std::make_shared<ShutdownState>();
  const auto shutdown_timeout = std::chrono::seconds(cli.shutdown_timeout);
  startup_exit.done();
  // Said only now: a signal sent on seeing it gets the graceful shutdown below (before
  // done() it ended the process at once, status 143).
  std::fprintf(stderr, "serving model '%s' on http://%s:%u (Ctrl-C to stop)\n",
               server_options.served_model_name.c_str(), cli.host.c_str(),
               static_cast<unsigned>((*server)->port()));
  std::fflush(stderr);
  std::thread signal_waiter([signals, engine_ptr, server_ptr, router_ptr, state, shutdown_timeout] {
    auto poll_signal = [&] {
      timespec poll{0, 50'000'000};
      return sigtimedwait(&signals, nullptr, &poll) > 0;
    };
    auto exit_now = [](const char* why) {
      std::fprintf(stderr, "%s: exiting now\n", why);
      std::fflush(stderr);
      std::_Exit(1);
    };
    // The first signal, or run() returning for another reason.
    int sig = 0;
    while (!state->run_finished.load()) {
      timespec poll{0, 50'000'000};
      sig = sigtimedwait(&signals, nullptr, &poll);
      if (sig > 0) break;
    }
    if (sig > 0 && !state->run_finished.load()) {
      // Waits until done() or `limit`, polling; a second signal exits at once.
      auto wait_until = [&](const std::function<bool()>& done, std::chrono::milliseconds limit) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (!done() && std::chrono::steady_clock::now() < deadline) {
          if (poll_signal()) exit_now("second signal");
        }
      };
      if (router_ptr == nullptr || !router_ptr->done()) {
        std::fprintf(stderr,
                     "\nsignal %d: draining — no new requests, /health 503, running requests "
                     "have %lld s to finish (signal again to exit at once)\n",
                     sig, static_cast<long long>(shutdown_timeout.count()));
        std::fflush(stderr);
      }
      server_ptr->begin_drain();
      wait_until([&] { return server_ptr->active_generations() == 0; }, shutdown_timeout);
      if (server_ptr->active_generations() > 0) {
        std::fprintf(stderr, "shutdown timeout: %lld requests end with finish_reason \"abort\"\n",
                     static_cast<long long>(server_ptr->active_generations()));
      }
      // What is left ends with "abort" (final chunk and [DONE]) while connections still exist.
      engine_ptr->stop();
      if (router_ptr != nullptr) {
        // The other ranks' requests end with "abort" too, then the ranks stop.
        if (Status s = router_ptr->finish(); !s.ok()) {
          std::fprintf(stderr, "warning: stopping the other ranks: %s\n", s.message().c_str());
        }
      }
      wait_until([&] { return server_ptr->active_generations() == 0; },
                 std::chrono::milliseconds(5000));
      // The last answers were handed to their connections: they get up to another
      // --shutdown-timeout to be written out (a slow reader's too), then the loop stops.
      server_ptr->stop_after_flush(
          std::max<std::chrono::milliseconds>(std::chrono::seconds(1), shutdown_timeout));
    }
    state->drained.store(true);  // the main thread may now tear the server down
    // The teardown joins the request workers; one can be busy with a request that no budget
    // has stopped yet (a chat template's render runs until its step budget). A signal now
    // exits at once, and so does a teardown still going --shutdown-timeout + 5 s after run()
    // returned: a server that was told to stop never hangs.
    while (!state->run_finished.load()) {
      if (poll_signal()) exit_now("second signal");
    }
    const auto deadline =
        std::chrono::steady_clock::now() + shutdown_timeout + std::chrono::seconds(5);
    while (!state->torn_down.load()) {
      if (poll_signal()) exit_now("signal during shutdown");
      if (std::chrono::steady_clock::now() > deadline) {
        exit_now("shutdown: request workers still busy past the shutdown timeout");
      }
    }
  });
  // A lost rank breaks the group: nothing can run any more, so the server ends (with the
  // error) instead of answering 503 forever.
  std::thread group_watcher;
  if (router_ptr != nullptr) {
    group_watcher = std::thread([router_ptr] {
      if (!router_ptr->wait_until_done().ok()) kill(getpid(), SIGTERM);
    });
  }
  (*server)->run();
  state->run_finished.store(true);
  // The signal thread may still be stopping the server (a signal came as run() returned).
  while (!state->drained.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  (*engine)->stop();
  Status group = ok_status();
  if (router_ptr != nullptr) {
    (void)router_ptr->finish();  // no-op when the signal path already stopped the group
    group = router_ptr->wait_until_done();
    group_watcher.join();
  }
  server->reset();
  engine->reset();
  state->torn_down.store(true);
  signal_waiter.join();
  if (!group.ok()) return session.fail(group);
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand("serve",
                                  "OpenAI-compatible HTTP server: all roles in one process, or one "
                                  "role (--role prefill|decode|router)");
  auto cli = std::make_shared<ServeCli>();
  sub->add_option("--model", cli->model_dir,
                  "Checkpoint directory (config.json, safetensors, "
                  "tokenizer.json); required except with --role router");
  sub->add_option("--host", cli->host,
                  "Address to listen on: an IP address or a host name (0.0.0.0 for every "
                  "interface; not empty)")
      ->check(non_empty_text())
      ->capture_default_str();
  sub->add_option("--port", cli->port, "Port (0 = any free port)")->capture_default_str();
  sub->add_option("--served-model-name", cli->served_model_name,
                  "Model name clients use (default: the --model folder's name)");
  // Checked here, before the model loads (minutes for a real checkpoint).
  sub->add_option("--max-num-seqs", cli->max_num_seqs, "Sequences in the running batch at most")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option(
         "--max-num-batched-tokens", cli->max_num_batched_tokens,
         "Tokens per engine step at most (prefill chunks + decodes); at least --max-num-seqs")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  sub->add_option("--max-prefill-chunk-tokens", cli->max_prefill_chunk_tokens,
                  "Prompt tokens one sequence computes per step at most while others are "
                  "running (0 = no cap besides --max-num-batched-tokens). A chunk's attention "
                  "costs about as much as that many decodes, so a small cap (e.g. 4 on a "
                  "--role decode instance, whose prompts arrive computed but for their last "
                  "block) spreads a new request's tail over several steps")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  sub->add_option("--kv-cache-memory", cli->kv_cache_memory,
                  "Bytes for the paged KV cache (K/M/G suffixes)")
      ->capture_default_str();
  sub->add_option("--api-key", cli->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/ routes (not empty)")
      ->check(non_empty_text());
  sub->add_option("--max-model-len", cli->max_model_len,
                  "Context length (prompt + output) limit (0, the default: the model's, "
                  "lowered to what the KV cache holds; a larger explicit value is refused)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--block-size", cli->block_size, "Tokens per KV block")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  sub->add_option("--max-waiting-requests", cli->max_waiting_requests,
                  "Waiting sequences at most; beyond it requests get 429")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  sub->add_option("--max-body-bytes", cli->max_body_bytes, "Request bodies beyond this get 413")
      ->check(whole_number_at_most(uint64_t{1} << 36, 1))
      ->capture_default_str();
  add_threads_option(sub, &cli->threads);
  sub->add_flag("--no-prefix-caching", cli->no_prefix_caching, "Disable prefix caching");
  sub->add_flag("--fp32", cli->fp32, "fp32 GEMM activations and KV cache (exactness checks)");
  sub->add_option("--microbatches", cli->microbatches,
                  "1, or 2 for the two-microbatch pipeline (one microbatch computes while the "
                  "other's expert exchange is in flight; docs/forward_stages.md)")
      ->check(CLI::IsMember({1, 2}))
      ->capture_default_str();
  CLI::Option* microbatches_option = sub->get_option("--microbatches");
  sub->add_option("--microbatch-split", cli->microbatch_split,
                  "With --microbatches 2, which steps run as two microbatches: measured (each "
                  "step size runs the way it measured faster, so the pipeline is never slower "
                  "than one microbatch beyond a little exploration; under --ep rank 0's "
                  "measurements decide for all ranks) or always")
      ->needs(microbatches_option)
      ->check(CLI::IsMember({"measured", "always"}))
      ->capture_default_str();
  add_ep_options(sub, &cli->ep);
  add_quantize_options(sub, &cli->quantize);
  add_attention_form_option(sub, &cli->attention_form);
  add_speculative_options(sub, &cli->speculative);
  add_kv_pool_options(sub, &cli->kv_pool);
  sub->add_option("--max-connections", cli->max_connections,
                  "Open HTTP connections at most; beyond it only GET /health and /metrics are "
                  "answered, the rest get 503 (lowered at start if the open-files limit cannot "
                  "hold it)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--max-connections-per-client", cli->max_connections_per_client,
                  "Open HTTP connections from one client address at most (same treatment)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--http-header-timeout", cli->header_timeout,
                  "Seconds a new connection has to send its first request header")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  sub->add_option("--http-idle-timeout", cli->idle_timeout,
                  "Seconds a keep-alive connection may stay idle between requests")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  sub->add_option("--max-inflight-request-bytes", cli->max_inflight_request,
                  "Request bodies received but not yet parsed and tokenized, at most (bytes, "
                  "K/M/G/KiB/MiB/GiB); beyond it requests get 503 with Retry-After (parsing, "
                  "chat templating and tokenization run on worker threads, off the HTTP loop)")
      ->capture_default_str();
  sub->add_option("--max-unsent-bytes", cli->max_unsent,
                  "Output queued for a client that does not read it, at most (K/M/G); beyond it "
                  "the client is dropped and its request aborted (backpressure)")
      ->capture_default_str();
  sub->add_option("--shutdown-timeout", cli->shutdown_timeout,
                  "On SIGTERM/SIGINT: seconds running requests get to finish (new ones get "
                  "503, /health 503) before the rest end with finish_reason \"abort\" (behind "
                  "--role router: an error event); answers already made then get as long "
                  "again to be written out to slow clients; a second signal exits at once")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  sub->add_option("--role", cli->role,
                  "all: everything in this process; prefill: compute prompts for decode "
                  "instances (their KV is pushed into the decode instance's reserved blocks "
                  "and stored in the pool); decode: have --prefill instances compute prompts "
                  "missing from the pool, then generate (both need --kv-pool); "
                  "router: no model, the OpenAI front end over --decode instances (least "
                  "loaded, health-checked; docs/disaggregation.md)")
      ->check(CLI::IsMember({"all", "prefill", "decode", "router"}))
      ->capture_default_str();
  sub->add_option("--prefill", cli->prefill_instances,
                  "With --role decode: HOST:PORT,... of 'serve --role prefill' instances. With "
                  "--role router: the same instances, health-checked by the router, which "
                  "names the least loaded in each request for the decode instance to try first "
                  "(it must be in that decode instance's own --prefill list)");
  sub->add_option("--prefill-timeout-ms", cli->prefill_timeout_ms,
                  "With --role decode: a prefill call gives up after this long (then the next "
                  "instance, then a local prefill)")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  sub->add_option("--kv-handoff-port", cli->kv_handoff_port,
                  "With --role decode: port where prefill instances push prompt KV straight "
                  "into the blocks this instance reserved for it (0: any free port; under "
                  "--ep, rank r listens on PORT + r; -1: no direct push, the KV comes through "
                  "the pool)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  sub->add_option("--kv-handoff-host", cli->kv_handoff_host,
                  "With --role decode: the address prefill instances reach the hand-off port "
                  "at (default: --host, or 127.0.0.1 when --host is 0.0.0.0 or ::)");
  CLI::Option* model_cache =
      sub->add_option("--model-cache", cli->model_cache,
                      "HOST:PORT,... of 'peerserve cache-server' members holding model weights: "
                      "when --model DIR has no checkpoint, it is fetched from them into DIR; "
                      "otherwise it is published there after loading, for later engines "
                      "(docs/caching_pool.md)");
  sub->add_option("--model-cache-id", cli->model_cache_id,
                  "The model's name in the model cache (default: the --model folder's name)")
      ->needs(model_cache);
  sub->add_option("--decode", cli->decode_instances,
                  "With --role router: HOST:PORT,... of the instances requests go to ('serve "
                  "--role decode', or any peerserve server of the same model)");
  sub->add_option("--router-connect-timeout-ms", cli->router_connect_timeout_ms,
                  "With --role router: connecting to an instance gives up after this long (then "
                  "the next instance is tried)")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  sub->add_option("--router-read-timeout-s", cli->router_read_timeout_s,
                  "With --role router: an instance silent this long (before its answer starts, "
                  "or between two pieces of it) has failed the request")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  sub->add_option("--health-check-interval-ms", cli->health_check_interval_ms,
                  "With --role router: how often every instance's /health is asked (down "
                  "instances leave the rotation and come back when healthy)")
      ->check(CLI::Range(10, 3600000))
      ->capture_default_str();
  sub->add_option("--seed", cli->seed, "Seed for requests without one (0 = random)")
      ->check(whole_number_at_most());
  sub->add_option("--chat-template", cli->chat_template,
                  "Jinja chat template FILE used instead of the model's (e.g. "
                  "data/chat_templates/deepseek_v3_tools.jinja, which also shows the model the "
                  "request's tools)");
  sub->add_option("--tool-call-parser", cli->tool_call_parser,
                  "How tool calls are read from the output: deepseek_v3 (the model's "
                  "<｜tool▁calls▁begin｜> tokens become message.tool_calls) or none (requests "
                  "with tools get 400)")
      ->check(CLI::IsMember({"deepseek_v3", "none"}))
      ->capture_default_str();
  sub->add_flag("--enable-auto-tool-choice", cli->enable_auto_tool_choice,
                "Accepted for vLLM compatibility: tool_choice \"auto\" is on whenever "
                "--tool-call-parser is not none");
  sub->add_option("--generation-config", cli->generation_config,
                  "Sampling defaults of requests that leave temperature, top_p, top_k, min_p or "
                  "repetition_penalty out: auto (the checkpoint's generation_config.json, as "
                  "vLLM) or vllm (OpenAI's: temperature 1, no truncation)")
      ->check(CLI::IsMember({"auto", "vllm"}))
      ->capture_default_str();
  sub->add_flag("--allow-forced-output", cli->allow_forced_output,
                "Testing hook: a chat request's 'peerserve_forced_output' text is decoded "
                "instead of the model's choice (to test clients against known output); never "
                "in production");
  cli->command = sub;
  sub->callback([cli] { set_command_exit_code(run_serve(*cli)); });
});

}  // namespace
}  // namespace peerserve
