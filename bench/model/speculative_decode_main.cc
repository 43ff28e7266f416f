// peerserve_bench_speculative_decode: decode tokens/s with and without MTP speculative
// decoding, through the serving path (scheduler + model executor), at several batch sizes.
// Each configuration (K = 0 = off, then the given K) runs --runs times, interleaved: the
// median tokens/s, the median over runs of each run's speed-up over the off run beside it,
// and the draft acceptance and tokens per sequence and step over all runs.
//
//   peerserve_bench_speculative_decode [--model DIR] [--text FILE] [--batch 1,8,32]
//       [--k 1,2] [--prompt 64] [--new-tokens 64] [--runs 3] [--threads 0]
//       [--draft-quantization int8|none] [--quantize none|int8]
//
// Without --model, the mini preset is written once to $TMPDIR/peerserve_bench_mini (a
// random MTP head: it shows the price of useless drafts). Prompts are cut from --text
// (default /usr/share/common-licenses/GPL-3) at different offsets when the checkpoint has a
// tokenizer, otherwise they are fixed pseudo-random ids. Greedy, EOS ignored.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "base/regular_file.h"
#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "bench/model/mini_model.h"
#include "model/deepseek_model.h"
#include "runtime/model_executor.h"
#include "runtime/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct Args {
  std::string model_dir;
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::vector<int> batches = {1, 8, 32};
  std::vector<int> ks = {1, 2};
  int prompt = 64;
  int new_tokens = 64;
  int runs = 3;
  int threads = 0;
  bool draft_int8 = true;  // as serve and generate: --speculative-draft-quantization int8
  bool main_int8 = false;  // as serve and generate: --quantize int8 (the LM head stays BF16)
};

struct Measurement {
  double decode_tokens_per_s = 0;
  int64_t drafts = 0;
  int64_t accepted = 0;
  int64_t decode_steps = 0;
  int64_t sequence_steps = 0;  // a sequence's token(s) from one decode step
  int64_t decode_tokens = 0;
  bool guard_stopped = false;  // auto: the guard turned speculation off during the run
};

// K = 0: off; K > 0: that many drafts; `policy` set: --speculative auto's setting.
Result<Measurement> measure(DeepseekModel& model, const std::vector<std::vector<int32_t>>& prompts,
                            int new_tokens, int32_t k, const SpeculativePolicy* policy = nullptr) {
  constexpr int64_t kBlockSize = 16;
  const KvLayout layout = model.kv_layout(kBlockSize, DType::kBF16);
  int64_t blocks = 0;
  for (const auto& p : prompts) {
    blocks += layout.blocks_for_tokens(static_cast<int64_t>(p.size()) + new_tokens + k + 1);
  }
  ModelExecutorOptions executor_options;
  executor_options.block_size = kBlockSize;
  executor_options.num_blocks = blocks;
  executor_options.num_speculative_tokens = k;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor,
                      ModelExecutor::create(&model, executor_options));
  SchedulerOptions options;
  options.max_num_seqs = static_cast<int32_t>(prompts.size());
  // Every prompt in the first step (decode is timed from the second): the budget holds them
  // all. With 8192 alone, 32 prompts of 512 spilled into step 2, timed as decode.
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  if (prompt_tokens > (int64_t{1} << 30)) return invalid_argument("prompts too long to bench");
  options.max_num_batched_tokens = static_cast<int32_t>(
      std::max<int64_t>(8192, prompt_tokens + static_cast<int64_t>(prompts.size()) * (k + 1)));
  options.max_model_len = 8192;
  options.block_pool = {.num_blocks = static_cast<int32_t>(blocks),
                        .block_size = static_cast<int32_t>(kBlockSize),
                        .enable_prefix_caching = false};
  options.num_speculative_tokens = k;
  if (policy != nullptr) {  // as serve sets it up
    options.num_speculative_tokens = policy->enabled ? 1 : 0;
    options.speculative_max_running = policy->max_running;
    options.speculative_guard_drafts = 256;
    options.speculative_min_acceptance = policy->break_even_acceptance;
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::create(options));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceSpec spec;
    spec.id = i + 1;
    spec.prompt_tokens = prompts[i];
    spec.max_tokens = new_tokens;
    spec.sampling.temperature = 0.0f;
    PS_RETURN_IF_ERROR(scheduler->add(spec));
  }
  // Every prompt is prefilled by the first step (the budget holds them all); decode is
  // timed from the second step on.
  Measurement m;
  using Clock = std::chrono::steady_clock;
  Clock::time_point decode_start;
  for (int64_t step = 0; scheduler->has_work(); ++step) {
    if (step == 1) decode_start = Clock::now();
    StepPlan plan = scheduler->schedule();
    PS_ASSIGN_OR_RETURN(StepResult result, executor->execute(plan));
    for (const SequenceUpdate& u : scheduler->update(plan, result)) {
      if (step == 0) continue;
      m.decode_tokens += static_cast<int64_t>(u.tokens.size());
      ++m.sequence_steps;
      m.drafts += u.num_drafts;
      m.accepted += u.num_accepted_drafts;
    }
    if (step > 0) ++m.decode_steps;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - decode_start).count();
  m.decode_tokens_per_s = static_cast<double>(m.decode_tokens) / std::max(seconds, 1e-9);
  m.guard_stopped = policy != nullptr && policy->enabled && !scheduler->speculation_enabled();
  return m;
}

struct Calibration {
  SpeculativePolicy policy;
  std::vector<SpeculativeCost> costs;  // one per batch size, in the order given
};

std::string format_ratio(double ratio) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2fx", ratio);
  return text;
}

// The calibration --speculative auto makes at start-up, at the bench's batch sizes.
Result<Calibration> calibrate(DeepseekModel& model, const std::vector<int>& batches,
                              int64_t context) {
  constexpr int64_t kBlockSize = 16;
  const KvLayout layout = model.kv_layout(kBlockSize, DType::kBF16);
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  ModelExecutorOptions options;
  options.block_size = kBlockSize;
  options.num_blocks = max_batch * layout.blocks_for_tokens(context + 2);
  options.num_speculative_tokens = 1;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor,
                      ModelExecutor::create(&model, options));
  const std::vector<int32_t> sizes(batches.begin(), batches.end());
  PS_ASSIGN_OR_RETURN(std::vector<SpeculativeCost> costs,
                      executor->measure_speculative_costs(sizes, context, 21));
  std::printf(
      "calibration (context %lld, median of 21): batch, decode step, speculative step "
      "(verify + MTP) / decode, verification alone / decode, MTP-only overhead, break-even "
      "acceptance\n",
      static_cast<long long>(context));
  for (const SpeculativeCost& c : costs) {
    std::printf("  %4d %9.0f us %8.2fx %8.2fx %8.0f%% %8.0f%%\n", c.batch, c.decode_s * 1e6,
                c.speculative_s / c.decode_s, c.verify_s / c.decode_s, 100.0 * c.idle_overhead(),
                100.0 * c.break_even_acceptance());
  }
  Calibration out{.policy = decide_speculative_policy(costs), .costs = std::move(costs)};
  std::printf("auto: %s\n", out.policy.reason.c_str());
  return out;
}

std::vector<int> parse_list(const char* flag, const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    out.push_back(static_cast<int>(peerserve::bench::flag_integer(flag, item, 1, 1 << 20)));
  }
  return out;
}

int run(const Args& args) {
  std::string dir = args.model_dir;
  if (dir.empty()) {
    dir = bench::default_mini_model_dir();
    if (Status s = bench::ensure_mini_model(dir); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  ModelOptions model_options;
  model_options.num_threads = args.threads;
  if (args.draft_int8) model_options.quantize_draft = WeightQuantization::kInt8;
  if (args.main_int8) model_options.quantize = WeightQuantization::kInt8;
  auto loaded = DeepseekModel::load(dir, model_options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  DeepseekModel& model = **loaded;
  if (!model.has_mtp()) {
    std::fprintf(stderr, "error: %s has no MTP layer\n", dir.c_str());
    return 1;
  }
  const int max_batch = *std::max_element(args.batches.begin(), args.batches.end());
  std::vector<std::vector<int32_t>> prompts;
  std::string source = "pseudo-random token ids";
  if (auto tokenizer = Tokenizer::load_from_dir(dir); tokenizer.ok()) {
    // A --text named on the command line must serve: it was replaced by pseudo-random ids
    // without a word when missing. The default text may be absent (not every system ships
    // it): then the pseudo-random prompts, and the line below says so.
    const bool default_text = args.text == Args().text;
    Result<std::string> text = read_regular_file(args.text, uint64_t{1} << 30);
    if (!text.ok() && !default_text) {
      std::fprintf(stderr, "error: --text: %s\n", text.status().message().c_str());
      return 1;
    }
    EncodeOptions plain;
    plain.add_special_tokens = false;
    auto ids = tokenizer->encode(text.ok() ? *text : std::string(), plain);
    if (!default_text && (!ids.ok() || ids->size() < static_cast<size_t>(args.prompt) * 2)) {
      std::fprintf(stderr, "error: --text %s: fewer than %d tokens (twice --prompt)\n",
                   args.text.c_str(), args.prompt * 2);
      return 1;
    }
    if (ids.ok() && ids->size() >= static_cast<size_t>(args.prompt) * 2) {
      source = args.text;
      const size_t stride = (ids->size() - args.prompt) / max_batch;
      for (int b = 0; b < max_batch; ++b) {
        const auto begin = ids->begin() + static_cast<std::ptrdiff_t>(b * stride);
        prompts.emplace_back(begin, begin + args.prompt);
      }
    }
  }
  if (prompts.empty()) {
    const int64_t vocab = model.config().vocab_size;
    for (int b = 0; b < max_batch; ++b) {
      std::vector<int32_t> p;
      for (int i = 0; i < args.prompt; ++i) {
        p.push_back(static_cast<int32_t>(3 + (i * 7919 + b * 104729) % (vocab - 3)));
      }
      prompts.push_back(p);
    }
  }
  std::printf(
      "model %s (%s), prompts of %d tokens from %s, %d new tokens, median of %d runs, drafter "
      "%s\n",
      dir.c_str(), args.main_int8 ? "W8A8" : "checkpoint weights", args.prompt, source.c_str(),
      args.new_tokens, args.runs, model.mtp_runs_int8() ? "int8" : "as the model");
  const Result<Calibration> calibration = calibrate(model, args.batches, args.prompt);
  if (!calibration.ok()) {
    std::fprintf(stderr, "error: %s\n", calibration.status().to_string().c_str());
    return 1;
  }
  const SpeculativePolicy* policy = &calibration->policy;
  std::printf("%6s %4s %12s %9s %11s %16s %16s %11s\n", "batch", "K", "decode tok/s", "vs off",
              "accepted", "drafts/seq/step", "tokens/seq/step", "free draft");
  std::vector<int32_t> ks = {0};
  for (int k : args.ks) ks.push_back(k);
  ks.push_back(-1);  // auto
  for (int batch : args.batches) {
    const std::vector<std::vector<int32_t>> subset(prompts.begin(), prompts.begin() + batch);
    std::vector<std::vector<double>> rates(ks.size());
    // Each run's speed-up over the run of K = 0 beside it (runs are interleaved so that a
    // drift of the machine moves both), and the drafts of all runs summed.
    std::vector<std::vector<double>> speedups(ks.size());
    std::vector<Measurement> total(ks.size());
    // auto's runs at a batch size follow one another as one server's requests do: once its
    // guard turned speculation off, the later runs start with it off.
    SpeculativePolicy auto_policy = *policy;
    std::string guard_note;
    for (int r = 0; r < args.runs; ++r) {
      for (size_t i = 0; i < ks.size(); ++i) {
        auto m = ks[i] < 0 ? measure(model, subset, args.new_tokens, 1, &auto_policy)
                           : measure(model, subset, args.new_tokens, ks[i]);
        if (!m.ok()) {
          std::fprintf(stderr, "error: %s\n", m.status().to_string().c_str());
          return 1;
        }
        if (ks[i] < 0 && m->guard_stopped) {
          auto_policy.enabled = false;
          guard_note = "auto at batch " + std::to_string(batch) +
                       ": the guard stopped drafting in run " + std::to_string(r + 1) + " after " +
                       std::to_string(m->drafts) + " drafts (" + std::to_string(m->accepted) +
                       " accepted; that run " +
                       format_ratio(m->decode_tokens_per_s / rates[0].back()) +
                       " of off); later runs start with it off\n";
        }
        rates[i].push_back(m->decode_tokens_per_s);
        speedups[i].push_back(m->decode_tokens_per_s / rates[0].back());
        total[i].drafts += m->drafts;
        total[i].accepted += m->accepted;
        total[i].sequence_steps += m->sequence_steps;
        total[i].decode_tokens += m->decode_tokens;
      }
    }
    for (size_t i = 0; i < ks.size(); ++i) {
      const Measurement& m = total[i];
      const double rate = bench::median(rates[i]);
      char accepted[32] = "-";
      if (m.drafts > 0) {
        std::snprintf(accepted, sizeof(accepted), "%.1f%%", 100.0 * m.accepted / m.drafts);
      }
      const double seq_steps = std::max<double>(1.0, static_cast<double>(m.sequence_steps));
      const std::string k_label = ks[i] < 0 ? "auto" : std::to_string(ks[i]);
      // K = 1: the speedup a free draft would give at this acceptance, verification costing
      // what the calibration timed at this batch size.
      char free_draft[32] = "-";
      const auto cost = std::find_if(calibration->costs.begin(), calibration->costs.end(),
                                     [&](const SpeculativeCost& c) { return c.batch == batch; });
      if (ks[i] == 1 && m.drafts > 0 && cost != calibration->costs.end()) {
        const double acceptance = static_cast<double>(m.accepted) / m.drafts;
        std::snprintf(free_draft, sizeof(free_draft), "%.2fx",
                      cost->free_draft_speedup(acceptance));
      }
      std::printf("%6d %4s %12.1f %8.2fx %11s %16.2f %16.2f %11s\n", batch, k_label.c_str(), rate,
                  bench::median(speedups[i]), accepted, static_cast<double>(m.drafts) / seq_steps,
                  static_cast<double>(m.decode_tokens) / seq_steps, free_draft);
    }
    if (!guard_note.empty()) std::fputs(guard_note.c_str(), stdout);
  }
  return 0;
}

}  // namespace
}  // namespace peerserve

constexpr const char* kUsage =
    "usage: peerserve_bench_speculative_decode [options]\n"
    "Decode tokens/s with and without MTP speculative decoding through the serving path\n"
    "(scheduler + model executor), each K interleaved with K = 0 (off) --runs times: median\n"
    "tokens/s, the median of each run's speedup over the off run beside it, and draft\n"
    "acceptance and tokens per sequence-step over all runs; for K = 1, the speedup a free\n"
    "draft would give at that acceptance (verification timed by the calibration); auto's runs\n"
    "at a batch size run as one server's requests: once its guard stopped drafting, the later\n"
    "runs start with it off. First the start-up calibration that --speculative auto decides\n"
    "from.\n"
    "  --model DIR        checkpoint with an MTP layer (default: the mini preset, written once\n"
    "                     to $TMPDIR/peerserve_bench_mini; its random MTP head accepts ~0%)\n"
    "  --text FILE        prompts are cut from it when the model has a tokenizer (default\n"
    "                     /usr/share/common-licenses/GPL-3); otherwise fixed pseudo-random ids\n"
    "  --batch LIST       sequences decoding together, comma-separated (default 1,8,32)\n"
    "  --k LIST           draft tokens per step to compare with off (default 1,2)\n"
    "  --prompt N         prompt tokens per sequence, >= 2 (default 64)\n"
    "  --new-tokens N     generated tokens per sequence, >= 2 (default 64; greedy, EOS ignored)\n"
    "  --runs N           interleaved runs per configuration, medians reported (default 3)\n"
    "  --threads N        threads (default 0: one per core)\n"
    "  --draft-quantization int8|none\n"
    "                     the MTP layer's precision, as serve's\n"
    "                     --speculative-draft-quantization (default int8)\n"
    "  --quantize none|int8\n"
    "                     the main model's precision, as serve's --quantize (default none:\n"
    "                     the checkpoint's weights; int8: W8A8, the LM head kept)\n"
    "  --help             this text\n";

int main(int argc, char** argv) {
  peerserve::Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--model" && has_value) {
      args.model_dir = argv[++i];
    } else if (arg == "--text" && has_value) {
      args.text = argv[++i];
    } else if (arg == "--batch" && has_value) {
      args.batches = peerserve::parse_list("--batch", argv[++i]);
    } else if (arg == "--k" && has_value) {
      args.ks = peerserve::parse_list("--k", argv[++i]);
    } else if (arg == "--prompt" && has_value) {
      args.prompt = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 24));
    } else if (arg == "--new-tokens" && has_value) {
      args.new_tokens =
          static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 24));
    } else if (arg == "--runs" && has_value) {
      args.runs = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 20));
    } else if (arg == "--threads" && has_value) {
      args.threads = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 0, 1024));
    } else if (arg == "--draft-quantization" && has_value) {
      const std::string value = argv[++i];
      if (value != "int8" && value != "none") {
        std::fprintf(stderr, "error: --draft-quantization '%s': expected int8 or none\n",
                     value.c_str());
        return 2;
      }
      args.draft_int8 = value == "int8";
    } else if (arg == "--quantize" && has_value) {
      const std::string value = argv[++i];
      if (value != "int8" && value != "none") {
        std::fprintf(stderr, "error: --quantize '%s': expected none or int8\n", value.c_str());
        return 2;
      }
      args.main_int8 = value == "int8";
    } else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  for (int b : args.batches) {
    if (b < 1) return std::fprintf(stderr, "error: batch sizes must be >= 1\n"), 2;
  }
  for (int k : args.ks) {
    if (k < 1 || k > peerserve::kMaxSpeculativeTokens) {
      return std::fprintf(stderr, "error: --k values must be 1..%d\n",
                          peerserve::kMaxSpeculativeTokens),
             2;
    }
  }
  if (args.batches.empty() || args.prompt < 2 || args.new_tokens < 2 || args.runs < 1) {
    std::fprintf(stderr, "error: --batch, --prompt >= 2, --new-tokens >= 2, --runs >= 1\n");
    return 2;
  }
  return peerserve::run(args);
}
