// peerserve generate: runs one prompt through the model and streams the completion.
//
//   peerserve generate --model DIR --prompt "Hello" [--chat] [--max-tokens 64]
//                      [--temperature 0] [--top-p 1] [--top-k 0] [--seed 0]
//   peerserve generate --model DIR --prompt-ids 0,1234,88      (no tokenizer needed: prints ids
//                                                               when the folder has none)
//
// Text goes to stdout as it is generated; the load progress bar and timings go to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/attention_form_option.h"
#include "apps/command_registry.h"
#include "apps/ep_options.h"
#include "apps/load_progress_bar.h"
#include "apps/quantize_options.h"
#include "apps/speculative_options.h"
#include "apps/threads_option.h"
#include "apps/token_id_list.h"
#include "apps/tokenizer_gaps.h"
#include "apps/whole_number_validator.h"
#include "base/regular_file.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/model_executor.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct GenerateCli {
  std::string model_dir;
  std::string prompt;
  std::string prompt_ids;
  bool chat = false;
  int64_t max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int threads = 0;
  std::string precision = "bf16";
  bool ignore_eos = false;
  EpCli ep;
  QuantizeCli quantize;
  std::string attention_form = "auto";
  SpeculativeCli speculative;
};

// Prompts longer than this are prefilled in several chunks (bounds activation memory).
constexpr int64_t kPrefillChunk = 1024;
constexpr int64_t kBlockSize = 16;

// Prints generated tokens as text (or ids without a tokenizer).
class TokenPrinter {
 public:
  explicit TokenPrinter(const Tokenizer* tokenizer) {
    if (tokenizer) detokenizer_ = std::make_unique<IncrementalDetokenizer>(*tokenizer);
  }
  void push(int32_t token) {
    if (detokenizer_) {
      auto text = detokenizer_->push(token);
      if (text.ok()) std::fputs(text->c_str(), stdout);
    } else {
      std::printf("%s%d", printed_ > 0 ? "," : "", token);
    }
    ++printed_;
    std::fflush(stdout);
  }
  void finish() {
    if (detokenizer_) std::fputs(detokenizer_->finish().c_str(), stdout);
    std::printf("\n");
    std::fflush(stdout);  // before the statistics on stderr (a pipe joining both)
  }

 private:
  std::unique_ptr<IncrementalDetokenizer> detokenizer_;
  int64_t printed_ = 0;
};

// Speculative decoding runs the prompt through the serving path (scheduler and model
// executor, which verify and draft), as one sequence. Under --ep the leader steps it in
// lock-step; the followers join every step's exchanges, the MTP layer's passes too.
int generate_speculative(const GenerateCli& cli, DeepseekModel& model,
                         const SpeculativeSetting& setting, const std::vector<int32_t>& prompt,
                         const SamplingParams& sampling, const Tokenizer* tokenizer,
                         EpSession& session) {
  constexpr int64_t kCalibrationContext = 64;
  int32_t num_speculative = setting.num_tokens;
  // An error of this rank alone: under --ep it ends the job (the others would wait for it).
  auto fail = [&session](const Status& status) { return session.fail(status); };
  if (Status s = session.install(model, kPrefillChunk); !s.ok()) return fail(s);
  if (!session.leader()) {
    // The executor's own empty step: the main layers' exchanges, then the MTP layer's.
    ModelExecutorOptions follower;
    follower.block_size = kBlockSize;
    follower.num_blocks = 1;
    follower.num_speculative_tokens = num_speculative;
    auto executor = ModelExecutor::create(&model, follower);
    if (!executor.ok()) return fail(executor.status());
    const Status s =
        session.follow(model, [&] { return (*executor)->execute(StepPlan{}).status(); });
    return s.ok() ? 0 : fail(s);
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + cli.max_tokens;
  const int64_t max_len = std::min(total, model.config().max_position_embeddings);
  const KvLayout layout = model.kv_layout(kBlockSize, DType::kBF16);
  ModelExecutorOptions executor_options;
  executor_options.block_size = kBlockSize;
  executor_options.num_blocks = std::max(layout.blocks_for_tokens(max_len + num_speculative),
                                         layout.blocks_for_tokens(kCalibrationContext + 2));
  executor_options.num_speculative_tokens = num_speculative;
  auto executor = ModelExecutor::create(&model, executor_options);
  if (!executor.ok()) return fail(executor.status());
  SpeculativePolicy policy;
  if (setting.automatic) {
    const int32_t batch = 1;
    auto costs = (*executor)->measure_speculative_costs({&batch, 1}, kCalibrationContext, 5);
    if (!costs.ok()) return fail(costs.status());
    policy = decide_speculative_policy(*costs);
    std::fprintf(stderr, "speculative auto: %s\n", policy.reason.c_str());
    if (!policy.enabled) num_speculative = 0;
  }
  SchedulerOptions options;
  options.max_num_seqs = 1;
  options.max_num_batched_tokens = static_cast<int32_t>(kPrefillChunk);
  options.max_model_len = std::max<int64_t>(max_len, 2);
  options.block_pool.block_size = static_cast<int32_t>(kBlockSize);
  options.block_pool.num_blocks = static_cast<int32_t>(executor_options.num_blocks);
  options.num_speculative_tokens = num_speculative;
  if (setting.automatic) {  // turned off for good if drafts are accepted below break-even
    options.speculative_guard_drafts = 64;
    options.speculative_min_acceptance = policy.break_even_acceptance;
  }
  auto scheduler = Scheduler::create(options);
  if (!scheduler.ok()) return fail(scheduler.status());
  SequenceSpec spec;
  spec.id = 1;
  spec.prompt_tokens = prompt;
  spec.max_tokens =
      static_cast<int32_t>(std::min<int64_t>(cli.max_tokens, max_len - prompt.size()));
  spec.sampling = sampling;
  spec.seed = cli.seed;
  if (!cli.ignore_eos) {
    for (const int64_t id : model.config().eos_token_ids) {
      spec.eos_token_ids.push_back(static_cast<TokenId>(id));
    }
  }
  if (Status s = (*scheduler)->add(spec); !s.ok()) return fail(s);

  TokenPrinter printer(tokenizer);
  int64_t generated = 0, steps = 0, drafts = 0, accepted = 0;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto first_token = start;
  while ((*scheduler)->has_work()) {
    StepPlan plan = (*scheduler)->schedule();
    if (Status s = session.agree_and_rebalance(model, plan.num_batched_tokens).status(); !s.ok()) {
      return fail(s);
    }
    auto result = (*executor)->execute(plan);
    if (!result.ok()) return fail(result.status());
    for (const SequenceUpdate& update : (*scheduler)->update(plan, *result)) {
      if (generated == 0 && !update.tokens.empty()) first_token = Clock::now();
      drafts += update.num_drafts;
      accepted += update.num_accepted_drafts;
      for (const SampledToken& t : update.tokens) printer.push(t.token);
      generated += static_cast<int64_t>(update.tokens.size());
    }
    ++steps;
  }
  printer.finish();
  if (Status s = session.finish(); !s.ok()) return fail(s);
  const auto end = Clock::now();
  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token).count();
  std::fprintf(stderr,
               "prompt %zu tokens in %.3f s (%.1f tok/s); generated %lld tokens, %.1f tok/s; MTP "
               "drafts accepted %lld of %lld (%.1f%%)\n",
               prompt.size(), prefill_s, prompt.size() / std::max(prefill_s, 1e-9),
               static_cast<long long>(generated),
               generated > 1 ? (generated - 1) / std::max(decode_s, 1e-9) : 0.0,
               static_cast<long long>(accepted), static_cast<long long>(drafts),
               drafts > 0 ? 100.0 * static_cast<double>(accepted) / drafts : 0.0);
  return 0;
}

int run_generate(const GenerateCli& cli) {
  auto started = EpSession::start(cli.ep);
  if (!started.ok()) return EpSession::report_start_error(started.status());
  EpSession& session = **started;
  // Errors every rank meets alike (options, prompt, tokenizer): rank 0 reports.
  auto fail = [&session](const Status& status) { return session.fail(status, true); };

  if (Status s = check_speculative_flags(cli.speculative); !s.ok()) return fail(s);
  if (cli.prompt.empty() == cli.prompt_ids.empty()) {
    return fail(invalid_argument(
        "give exactly one of --prompt and --prompt-ids (an empty value counts as none)"));
  }
  if (cli.max_tokens < 1) return fail(invalid_argument("--max-tokens must be >= 1"));
  if (cli.precision != "bf16" && cli.precision != "fp32") {
    return fail(invalid_argument("--precision '" + cli.precision + "': expected bf16 or fp32"));
  }
  SamplingParams sampling;
  sampling.temperature = cli.temperature;
  sampling.top_p = cli.top_p;
  sampling.top_k = cli.top_k;
  if (Status s = sampling.validate(); !s.ok()) return fail(s);

  // The tokenizer is optional with --prompt-ids (then ids are printed), so a missing model
  // folder is said first (it was "tokenizer.json: needed for --prompt (use --prompt-ids)").
  if (Status s = require_directory(cli.model_dir, "the model folder"); !s.ok()) return fail(s);
  std::unique_ptr<Tokenizer> tokenizer;
  if (std::filesystem::exists(std::filesystem::path(cli.model_dir) / "tokenizer.json")) {
    auto loaded = Tokenizer::load_from_dir(cli.model_dir);
    if (!loaded.ok()) return fail(loaded.status());
    tokenizer = std::make_unique<Tokenizer>(std::move(loaded).value());
    if (session.leader()) warn_about_tokenizer_gaps(*tokenizer);
  } else if (!cli.prompt.empty()) {
    return fail(
        not_found(cli.model_dir + "/tokenizer.json: needed for --prompt (use --prompt-ids)"));
  }
  if (cli.chat && (!tokenizer || cli.prompt.empty())) {
    return fail(invalid_argument("--chat needs --prompt and a tokenizer with a chat template"));
  }

  std::vector<int32_t> prompt;
  if (!cli.prompt_ids.empty()) {
    auto ids = parse_token_id_list("--prompt-ids", cli.prompt_ids);
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  } else if (cli.chat) {
    ChatTemplateInput input;
    input.messages = nlohmann::json::array({{{"role", "user"}, {"content", cli.prompt}}});
    input.add_generation_prompt = true;
    auto ids = tokenizer->encode_chat(input);
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  } else {
    auto ids = tokenizer->encode(cli.prompt);
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  }

  ModelOptions options;
  options.num_threads = cli.threads;
  options.gemm_precision = cli.precision == "fp32" ? GemmPrecision::kFp32 : GemmPrecision::kBf16;
  options.load_mtp = cli.speculative.method != "off";
  if (Status s = apply_quantize_options(cli.quantize, &options); !s.ok()) return fail(s);
  apply_draft_quantization(cli.speculative, &options);
  options.attention_form = attention_form_named(cli.attention_form);
  if (Status s = session.plan_experts(cli.model_dir, &options); !s.ok()) return fail(s);
  auto loaded = session.leader() ? load_model_showing_progress(cli.model_dir, options)
                                 : DeepseekModel::load(cli.model_dir, options);
  if (!loaded.ok()) return session.fail(loaded.status());
  DeepseekModel& model = **loaded;
  Result<SpeculativeSetting> speculative =
      resolve_speculative_options(cli.speculative, model.has_mtp());
  if (!speculative.ok()) return fail(speculative.status());
  if (speculative->automatic && session.distributed()) {
    // auto's calibration times one process's steps; under --ep they need every rank.
    if (session.leader()) {
      std::fprintf(stderr, "speculative auto: off under --ep (use --speculative mtp to draft)\n");
    }
    *speculative = SpeculativeSetting{};
  }
  // The context bounds what can be generated: a prompt that fills it is an error (the
  // speculative path said "max_tokens = -2"), and a shorter budget is said, not silent.
  const int64_t context = model.config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) >= context) {
    return fail(out_of_range("the prompt's " + std::to_string(prompt.size()) +
                             " tokens leave no room in the model's context of " +
                             std::to_string(context) + " positions (max_position_embeddings)"));
  }
  if (static_cast<int64_t>(prompt.size()) + cli.max_tokens > context && session.leader()) {
    std::fprintf(stderr,
                 "note: at most %lld tokens: the prompt's %zu and --max-tokens %lld exceed the "
                 "model's context of %lld positions\n",
                 static_cast<long long>(context - static_cast<int64_t>(prompt.size())),
                 prompt.size(), static_cast<long long>(cli.max_tokens),
                 static_cast<long long>(context));
  }
  if (speculative->num_tokens > 0) {
    return generate_speculative(cli, model, *speculative, prompt, sampling, tokenizer.get(),
                                session);
  }
  if (Status s = session.install(model, kPrefillChunk); !s.ok()) return session.fail(s);
  if (!session.leader()) {
    // Followers bring no requests: they lend their experts to the leader's steps.
    auto cache = LatentKvCache::create(model.kv_layout(kBlockSize, DType::kBF16), 1);
    if (!cache.ok()) return session.fail(cache.status());
    if (Status s = session.follow(model, *cache); !s.ok()) return session.fail(s);
    return 0;
  }

  const int64_t total = static_cast<int64_t>(prompt.size()) + cli.max_tokens;
  const int64_t max_len = std::min(total, model.config().max_position_embeddings);
  const KvLayout layout = model.kv_layout(kBlockSize, DType::kBF16);
  auto cache = LatentKvCache::create(layout, layout.blocks_for_tokens(max_len));
  if (!cache.ok()) return session.fail(cache.status());
  std::vector<int32_t> blocks(cache->num_blocks());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);

  std::vector<int32_t> tokens = prompt;
  std::vector<int32_t> generated;
  TokenPrinter printer(tokenizer.get());
  const std::vector<int64_t>& eos_ids = model.config().eos_token_ids;
  ForwardOutput out;
  auto state = model.new_forward_state();
  int64_t cached = 0;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto first_token = start;
  while (true) {
    // Prefill (in chunks) or one decode token.
    while (cached < static_cast<int64_t>(tokens.size())) {
      SequenceChunk chunk;
      const int64_t n = std::min<int64_t>(kPrefillChunk, tokens.size() - cached);
      chunk.tokens = std::span<const int32_t>(tokens).subspan(cached, n);
      chunk.start_pos = cached;
      chunk.block_table = blocks;
      if (Status s = session.forward(model, {&chunk, 1}, *cache, *state, &out); !s.ok()) {
        return session.fail(s);
      }
      cached += n;
    }
    if (generated.empty()) first_token = Clock::now();
    const SampledToken next = sample_token(out.last_logits(0), sampling, {generated, cli.seed});
    generated.push_back(next.token);
    tokens.push_back(next.token);
    printer.push(next.token);
    const bool is_eos =
        std::find(eos_ids.begin(), eos_ids.end(), int64_t{next.token}) != eos_ids.end();
    const bool stop = (!cli.ignore_eos && is_eos) ||
                      static_cast<int64_t>(generated.size()) >= cli.max_tokens ||
                      static_cast<int64_t>(tokens.size()) >= max_len;
    if (stop) break;
  }
  printer.finish();
  if (Status s = session.finish(); !s.ok()) return session.fail(s);
  const auto end = Clock::now();
  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token).count();
  std::fprintf(
      stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens, %.1f tok/s\n",
      prompt.size(), prefill_s, prompt.size() / std::max(prefill_s, 1e-9), generated.size(),
      generated.size() > 1 ? (generated.size() - 1) / std::max(decode_s, 1e-9) : 0.0);
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto cli = std::make_shared<GenerateCli>();
  CLI::App* sub = root.add_subcommand("generate", "Generate a completion for one prompt");
  sub->add_option("--model", cli->model_dir, "Checkpoint folder (config.json, safetensors)")
      ->required();
  sub->add_option("--prompt", cli->prompt, "Prompt text (needs tokenizer.json)");
  sub->add_option("--prompt-ids", cli->prompt_ids, "Prompt as comma-separated token ids");
  sub->add_flag("--chat", cli->chat, "Wrap the prompt as a user message with the chat template");
  sub->add_option("--max-tokens", cli->max_tokens, "Tokens to generate (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  sub->add_option("--temperature", cli->temperature,
                  "Sampling temperature; 0 = greedy (default 0)");
  sub->add_option("--top-p", cli->top_p, "Nucleus sampling mass (default 1 = off)");
  sub->add_option("--top-k", cli->top_k, "Keep the k most likely tokens (default 0 = off)");
  sub->add_option("--seed", cli->seed, "Sampling seed (default 0)")->check(whole_number_at_most());
  add_threads_option(sub, &cli->threads);
  sub->add_option("--precision", cli->precision,
                  "GEMM activation precision: bf16 (default) or fp32");
  sub->add_flag("--ignore-eos", cli->ignore_eos, "Keep generating after the end-of-sequence token");
  add_ep_options(sub, &cli->ep);
  add_quantize_options(sub, &cli->quantize);
  add_attention_form_option(sub, &cli->attention_form);
  add_speculative_options(sub, &cli->speculative);
  sub->callback([cli] { set_command_exit_code(run_generate(*cli)); });
});

}  // namespace
}  // namespace peerserve
