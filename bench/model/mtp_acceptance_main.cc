// peerserve_bench_mtp_acceptance: the MTP draft acceptance rate of a trained checkpoint,
// measured by the engine (DeepseekModel + its MTP layer over the paged latent KV cache).
//
// Greedy decoding with one MTP draft per position: after the main model has produced
// token t[j + 1] from position j, the MTP layer drafts t[j + 2] from (hidden[j], t[j + 1]);
// the main model's next greedy token is what the draft had to match. Two rates come out:
//   per position:  accepted drafts / drafts over every position of the generations;
//   speculative:   the schedule of self-speculative decoding with one draft token (an
//                  accepted draft skips the next position's draft), which is what a
//                  speculative decoder would see, and the script's definition
//                  (mtp_acceptance_greedy_generation in training_report.json).
// Then the same prompts run through the serving path with speculative decoding (the
// scheduler and model executor with --num-speculative-tokens 1, greedy, every prompt in one
// batch), whose own counters must equal the speculative schedule's (printed side by side).
//
//   peerserve_bench_mtp_acceptance --model DIR --heldout FILE.jsonl [--prompts 16]
//       [--prompt-len 32] [--new-tokens 64] [--window 257] [--precision bf16|fp32]
//       [--threads 0]
//
// FILE.jsonl: one {"text": ...} document per line (the training script's held-out split,
// tools/train_reference_model/data/heldout.jsonl). As in the script, the documents become
// one stream of [BOS] text [EOS], cut into windows of --window tokens (seq_len + 1); each
// prompt is the start of one window. With the defaults the prompts are the script's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/flag_value.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/model_executor.h"
#include "runtime/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct Options {
  std::string model_dir;
  std::string heldout_path;
  int prompts = 16;
  int prompt_len = 32;
  int new_tokens = 64;
  int window = 257;
  std::string precision = "bf16";
  int threads = 0;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// [BOS] text [EOS] per document, special-token strings read as plain text.
Result<std::vector<int32_t>> heldout_stream(const Tokenizer& tokenizer, const std::string& path,
                                            size_t wanted_tokens) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {  // a device's first line never ends
    return std::filesystem::exists(path, error) ? invalid_argument(path + ": not a regular file")
                                                : not_found(path + ": no such file");
  }
  std::ifstream file(path);
  if (!file) return not_found(path + ": cannot open");
  std::vector<int32_t> stream;
  std::string line;
  int64_t line_number = 0;
  EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.match_added_tokens = false;
  while (stream.size() < wanted_tokens && std::getline(file, line)) {
    ++line_number;
    const nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string()) {
      return invalid_argument(path + ":" + std::to_string(line_number) +
                              ": expected a JSON object with a string \"text\"");
    }
    PS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        tokenizer.encode(doc["text"].get<std::string>(), plain));
    stream.push_back(*tokenizer.bos_id());
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(*tokenizer.eos_id());
  }
  return stream;
}

struct Counts {
  int64_t position_drafts = 0;
  int64_t position_accepted = 0;
  int64_t speculative_drafts = 0;
  int64_t speculative_accepted = 0;
};

// One prompt: prefill (main, then MTP over every prompt position), then greedy decoding
// until `new_tokens` tokens follow the prompt, recording at every position j whether the
// MTP draft made there equals the greedy token t[j + 2].
Status replay(DeepseekModel& model, DType kv_dtype, std::span<const int32_t> prompt, int new_tokens,
              Counts* counts) {
  constexpr int64_t kBlockSize = 16;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const KvLayout layout = model.kv_layout(kBlockSize, kv_dtype);
  PS_ASSIGN_OR_RETURN(LatentKvCache cache,
                      LatentKvCache::create(layout, layout.blocks_for_tokens(n + new_tokens)));
  std::vector<int32_t> table(cache.num_blocks());
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);

  SequenceChunk chunk;
  chunk.tokens = prompt;
  chunk.block_table = table;
  chunk.all_logits = true;  // the MTP layer needs every prompt position's hidden state
  ForwardOutput main_out;
  PS_RETURN_IF_ERROR(model.forward({&chunk, 1}, cache, &main_out));
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.push_back(argmax(main_out.last_logits(0)));

  MtpChunk mtp;
  mtp.next_tokens = std::span<const int32_t>(seq).subspan(1);
  mtp.hidden = main_out.hidden;
  mtp.block_table = table;
  ForwardOutput draft_out;
  PS_RETURN_IF_ERROR(model.forward_mtp({&mtp, 1}, cache, &draft_out));
  int32_t draft = argmax(draft_out.last_logits(0));  // made at j = n - 1

  std::vector<bool> accepted_at;  // index j - (n - 1)
  while (static_cast<int64_t>(seq.size()) < n + new_tokens) {
    const int64_t pos = static_cast<int64_t>(seq.size()) - 1;  // decode t[pos]
    SequenceChunk decode;
    decode.tokens = std::span<const int32_t>(seq).subspan(pos, 1);
    decode.start_pos = pos;
    decode.block_table = table;
    PS_RETURN_IF_ERROR(model.forward({&decode, 1}, cache, &main_out));
    seq.push_back(argmax(main_out.last_logits(0)));
    accepted_at.push_back(draft == seq.back());  // the draft made at j = pos - 1

    MtpChunk step;
    step.next_tokens = std::span<const int32_t>(seq).subspan(pos + 1, 1);
    step.hidden = main_out.hidden_row(0);
    step.start_pos = pos;
    step.block_table = table;
    PS_RETURN_IF_ERROR(model.forward_mtp({&step, 1}, cache, &draft_out));
    draft = argmax(draft_out.last_logits(0));
  }

  for (const bool ok : accepted_at) {
    ++counts->position_drafts;
    counts->position_accepted += ok ? 1 : 0;
  }
  // Self-speculative schedule: a draft at j that is accepted yields t[j + 1] and t[j + 2]
  // in one step, so the next draft is made at j + 2; a rejected one moves on to j + 1.
  for (size_t k = 0; k < accepted_at.size();) {
    ++counts->speculative_drafts;
    if (accepted_at[k]) {
      ++counts->speculative_accepted;
      k += 2;
    } else {
      k += 1;
    }
  }
  return ok_status();
}

// The prompts through the scheduler and the model executor with one MTP draft per step.
Status engine_replay(DeepseekModel& model, DType kv_dtype,
                     const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
                     Counts* counts) {
  constexpr int64_t kBlockSize = 16;
  const KvLayout layout = model.kv_layout(kBlockSize, kv_dtype);
  int64_t blocks = 0;
  for (const auto& p : prompts) {
    blocks += layout.blocks_for_tokens(static_cast<int64_t>(p.size()) + new_tokens + 1);
  }
  ModelExecutorOptions executor_options;
  executor_options.block_size = kBlockSize;
  executor_options.num_blocks = blocks;
  executor_options.kv_dtype = kv_dtype;
  executor_options.num_speculative_tokens = 1;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor,
                      ModelExecutor::create(&model, executor_options));
  SchedulerOptions options;
  options.max_num_seqs = static_cast<int32_t>(prompts.size());
  options.max_num_batched_tokens = 4096;
  options.max_model_len = 4096;
  options.block_pool = {.num_blocks = static_cast<int32_t>(blocks),
                        .block_size = static_cast<int32_t>(kBlockSize),
                        .enable_prefix_caching = false};
  options.num_speculative_tokens = 1;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::create(options));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceSpec spec;
    spec.id = i + 1;
    spec.prompt_tokens = prompts[i];
    spec.max_tokens = new_tokens;
    spec.sampling.temperature = 0.0f;
    PS_RETURN_IF_ERROR(scheduler->add(spec));
  }
  while (scheduler->has_work()) {
    StepPlan plan = scheduler->schedule();
    PS_ASSIGN_OR_RETURN(StepResult result, executor->execute(plan));
    for (const SequenceUpdate& u : scheduler->update(plan, result)) {
      counts->speculative_drafts += u.num_drafts;
      counts->speculative_accepted += u.num_accepted_drafts;
    }
  }
  return ok_status();
}

int run(const Options& o) {
  if (o.precision != "bf16" && o.precision != "fp32") {
    return fail("--precision '" + o.precision + "': expected bf16 or fp32");
  }
  if (o.prompts < 1 || o.prompt_len < 2 || o.new_tokens < 1) {
    return fail("--prompts >= 1, --prompt-len >= 2 and --new-tokens >= 1 are required");
  }
  auto tokenizer = Tokenizer::load_from_dir(o.model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status().to_string());
  if (!tokenizer->bos_id() || !tokenizer->eos_id()) {
    return fail(o.model_dir + ": the tokenizer needs BOS and EOS tokens");
  }
  if (o.window < o.prompt_len) return fail("--window must be >= --prompt-len");

  const size_t wanted = static_cast<size_t>(o.window) * static_cast<size_t>(o.prompts);
  auto stream = heldout_stream(*tokenizer, o.heldout_path, wanted);
  if (!stream.ok()) return fail(stream.status().to_string());
  if (stream->size() < wanted) {
    return fail(o.heldout_path + ": " + std::to_string(stream->size()) +
                " tokens, fewer than --prompts x --window");
  }

  const bool fp32 = o.precision == "fp32";
  ModelOptions model_options;
  model_options.num_threads = o.threads;
  model_options.gemm_precision = fp32 ? GemmPrecision::kFp32 : GemmPrecision::kBf16;
  auto model = DeepseekModel::load(o.model_dir, model_options);
  if (!model.ok()) return fail(model.status().to_string());
  if (!(*model)->has_mtp()) return fail(o.model_dir + ": the checkpoint has no MTP layer");

  Counts counts;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < o.prompts; ++p) {
    const auto begin = stream->begin() + static_cast<std::ptrdiff_t>(p) * o.window;
    prompts.emplace_back(begin, begin + o.prompt_len);
    if (Status s = replay(**model, fp32 ? DType::kF32 : DType::kBF16, prompts.back(), o.new_tokens,
                          &counts);
        !s.ok()) {
      return fail(s.to_string());
    }
  }
  Counts engine;
  if (Status s =
          engine_replay(**model, fp32 ? DType::kF32 : DType::kBF16, prompts, o.new_tokens, &engine);
      !s.ok()) {
    return fail(s.to_string());
  }
  auto percent = [](int64_t part, int64_t whole) {
    return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  };
  std::printf("model %s, %s activations\n", o.model_dir.c_str(), o.precision.c_str());
  std::printf("%d held-out prompts of %d tokens, %d greedy tokens each\n", o.prompts, o.prompt_len,
              o.new_tokens);
  std::printf("MTP acceptance, every position:        %lld of %lld = %.1f%%\n",
              static_cast<long long>(counts.position_accepted),
              static_cast<long long>(counts.position_drafts),
              percent(counts.position_accepted, counts.position_drafts));
  std::printf("MTP acceptance, speculative schedule:  %lld of %lld = %.1f%%\n",
              static_cast<long long>(counts.speculative_accepted),
              static_cast<long long>(counts.speculative_drafts),
              percent(counts.speculative_accepted, counts.speculative_drafts));
  std::printf("MTP acceptance, engine (K = 1):        %lld of %lld = %.1f%%%s\n",
              static_cast<long long>(engine.speculative_accepted),
              static_cast<long long>(engine.speculative_drafts),
              percent(engine.speculative_accepted, engine.speculative_drafts),
              engine.speculative_accepted == counts.speculative_accepted &&
                      engine.speculative_drafts == counts.speculative_drafts
                  ? " (equal to the speculative schedule)"
                  : " (DIFFERS from the speculative schedule)");
  return 0;
}

}  // namespace
}  // namespace peerserve

constexpr const char* kUsage =
    "usage: peerserve_bench_mtp_acceptance --model DIR --heldout FILE.jsonl [options]\n"
    "The MTP draft acceptance of a trained checkpoint, greedy: per position, and on the\n"
    "schedule of speculative decoding with one draft; then the same prompts through the\n"
    "serving path with --num-speculative-tokens 1, whose counters must equal the schedule.\n"
    "  --model DIR          checkpoint with an MTP layer and a tokenizer (required)\n"
    "  --heldout FILE       JSON lines of {\"text\": ...} documents, e.g. the training\n"
    "                       script's tools/train_reference_model/data/heldout.jsonl (required)\n"
    "  --prompts N          prompts, one per window of the document stream (default 16)\n"
    "  --prompt-len N       tokens of each prompt (default 32)\n"
    "  --new-tokens N       greedy tokens generated per prompt (default 64)\n"
    "  --window N           window length the stream is cut into, seq_len + 1 (default 257)\n"
    "  --precision P        bf16 or fp32 GEMM activations (default bf16)\n"
    "  --threads N          threads (default 0: one per core)\n"
    "  --help               this text\n";

int main(int argc, char** argv) {
  peerserve::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--model" && has_value) {
      o.model_dir = argv[++i];
    } else if (arg == "--heldout" && has_value) {
      o.heldout_path = argv[++i];
    } else if (arg == "--prompts" && has_value) {
      o.prompts = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 24));
    } else if (arg == "--prompt-len" && has_value) {
      o.prompt_len = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 24));
    } else if (arg == "--new-tokens" && has_value) {
      o.new_tokens = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 1, 1 << 24));
    } else if (arg == "--window" && has_value) {
      o.window = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 2, 1 << 24));
    } else if (arg == "--precision" && has_value) {
      o.precision = argv[++i];
    } else if (arg == "--threads" && has_value) {
      o.threads = static_cast<int>(peerserve::bench::flag_integer(arg, argv[++i], 0, 1024));
    } else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (o.model_dir.empty() || o.heldout_path.empty()) {
    std::fprintf(stderr, "error: --model and --heldout are required\n%s", kUsage);
    return 2;
  }
  return peerserve::run(o);
}
