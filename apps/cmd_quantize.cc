// peerserve quantize: writes an INT8 (W8A8) copy of a checkpoint (model/int8_checkpoint.h,
// docs/quantization.md) that serve, generate, score and the benches load like any other.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "apps/command_registry.h"
#include "apps/load_progress_bar.h"
#include "apps/threads_option.h"
#include "base/regular_file.h"
#include "model/int8_calibration.h"
#include "model/int8_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct QuantizeCli {
  std::string model_dir;
  std::string out_dir;
  std::string scheme = "w8a8";
  std::string lm_head = "int8";
  std::string calib;
  int64_t calib_tokens = 2048;
  int64_t calib_rows = 256;
  std::string pipeline;
  int threads = 0;
  bool report = false;
};

// Tokenizes the calibration text and runs the calibration (model/int8_calibration.h).
Result<Int8Transforms> calibrate(const QuantizeCli& cli, const Int8PipelineOptions& pipeline) {
  PS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load_from_dir(cli.model_dir));
  // A text file or a pipe (a corpus piped in). Only a prefix is read and tokenized: 64 bytes
  // per requested token (far more than any tokenizer needs; at least 1 MiB), so that a large
  // corpus or an endless stream costs that much and no more (the whole file took ~11x its
  // size).
  const int64_t budget = std::max<int64_t>(int64_t{1} << 20, cli.calib_tokens * 64);
  PS_ASSIGN_OR_RETURN(TextPrefix prefix, read_text_file_or_pipe(cli.calib, "--calib " + cli.calib,
                                                                static_cast<uint64_t>(budget)));
  std::string& text = prefix.text;
  if (prefix.more) {
    // Cut where the text was: after the last newline in its second half, else at the last
    // whole UTF-8 character (never most of the text for want of a newline).
    const size_t newline = text.rfind('\n');
    if (newline != std::string::npos && newline >= text.size() / 2) {
      text.resize(newline + 1);
    } else {
      size_t end = text.size();
      while (end > 0 && (static_cast<unsigned char>(text[end - 1]) & 0xC0) == 0x80) --end;
      if (end > 0 && static_cast<unsigned char>(text[end - 1]) >= 0xC0) --end;  // its lead
      text.resize(end);
    }
  }
  EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.match_added_tokens = false;
  PS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.encode(text, plain));
  if (static_cast<int64_t>(ids.size()) > cli.calib_tokens) ids.resize(cli.calib_tokens);
  if (ids.empty()) return invalid_argument(cli.calib + ": no tokens");
  CalibrationOptions options;
  options.pipeline = pipeline;
  options.max_sample_rows = cli.calib_rows;
  options.lm_head = cli.lm_head == "int8";
  options.num_threads = cli.threads;
  std::fprintf(stderr, "calibrating on %zu tokens of %s\n", ids.size(), cli.calib.c_str());
  return calibrate_int8(cli.model_dir, ids, tokenizer.bos_id().value_or(0), options);
}

int run_quantize(const QuantizeCli& cli) {
  Int8CheckpointOptions options;
  options.lm_head = cli.lm_head == "int8";
  const std::string pipeline_name =
      !cli.pipeline.empty() ? cli.pipeline : (cli.calib.empty() ? "rtn" : "full");
  Result<Int8PipelineOptions> pipeline = parse_int8_pipeline(pipeline_name);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "error: %s\n", pipeline.status().message().c_str());
    return kExitFailure;
  }
  if (!pipeline->any() && !cli.calib.empty()) {
    std::fprintf(stderr,
                 "error: --pipeline %s does not calibrate: --calib %s would not be read (drop "
                 "it, or choose calibration steps: --pipeline full, smooth, ...)\n",
                 pipeline_name.c_str(), cli.calib.c_str());
    return kExitFailure;
  }
  if (pipeline->any() && cli.calib.empty()) {
    std::fprintf(stderr, "error: --pipeline %s needs a calibration text (--calib FILE)\n",
                 pipeline_name.c_str());
    return kExitFailure;
  }
  // Before the calibration, which can take long: nothing is overwritten.
  if (Status s = check_int8_output_dir(cli.model_dir, cli.out_dir); !s.ok()) {
    std::fprintf(stderr, "error: --out: %s\n", s.message().c_str());
    return kExitFailure;
  }
  Int8Transforms transforms;
  if (pipeline->any()) {
    Result<Int8Transforms> calibrated = calibrate(cli, *pipeline);
    if (!calibrated.ok()) {
      std::fprintf(stderr, "error: %s\n", calibrated.status().message().c_str());
      return kExitFailure;
    }
    transforms = std::move(calibrated).value();
    double rtn = 0, smoothed = 0, final_error = 0, reference = 0;
    for (const CalibrationGroupReport& g : transforms.groups) {
      rtn += g.rtn_error;
      smoothed += g.smoothed_error;
      final_error += g.error;
      reference += g.reference;
      if (cli.report) {
        std::fprintf(stderr,
                     "  %-48s %4lld w %6lld rows  rel err rtn %.3e -> smooth %.3e (alpha %s) -> "
                     "final %.3e (mean clip %.3f)\n",
                     g.name.c_str(), static_cast<long long>(g.weights),
                     static_cast<long long>(g.sample_rows), std::sqrt(g.rtn_error / g.reference),
                     std::sqrt(g.smoothed_error / g.reference),
                     g.alpha < 0 ? "none" : std::to_string(g.alpha).substr(0, 3).c_str(),
                     std::sqrt(g.error / g.reference), g.mean_clip);
      }
    }
    if (pipeline->compensate) {
      double before = 0, after = 0;
      int64_t weights = 0;
      for (const CalibrationGroupReport& g : transforms.groups) {
        before += g.compensation_before;
        after += g.compensation_after;
        weights += g.compensated_weights;
      }
      std::fprintf(stderr,
                   "error compensation: kept for %lld weights; held-out sample error %.4e -> "
                   "%.4e (%+.2f%%)\n",
                   static_cast<long long>(weights), before, after,
                   before > 0 ? 100.0 * (after - before) / before : 0.0);
    }
    // No group with a sampled input: nothing to relate the errors to (not NaN).
    const double scale = reference > 0 ? reference : 1.0;
    std::fprintf(stderr,
                 "pipeline %s over %zu groups: sample output error (relative) rtn %.4e, after "
                 "smoothing %.4e, final %.4e; %zu norms smoothed, %zu weights clipped\n",
                 pipeline_name.c_str(), transforms.groups.size(), std::sqrt(rtn / scale),
                 std::sqrt(smoothed / scale), std::sqrt(final_error / scale),
                 transforms.norm_divisor.size(), transforms.row_clip.size());
    options.transforms = &transforms;
  }
  LoadProgressBar progress("quantizing");
  options.progress = progress.callback();
  // A tied head is the embedding table, which the checkpoint keeps in BF16.
  const Result<ModelConfig> config = load_model_config(cli.model_dir + "/config.json");
  const bool tied = config.ok() && config->tie_word_embeddings;
  const std::string head = tied ? "tied to the embeddings, BF16" : cli.lm_head;
  std::fprintf(stderr,
               "quantizing %s to %s (W8A8: INT8 weights per output channel, lm_head %s, "
               "pipeline %s)\n",
               cli.model_dir.c_str(), cli.out_dir.c_str(), head.c_str(), pipeline_name.c_str());
  const auto start = std::chrono::steady_clock::now();
  Result<Int8CheckpointSummary> summary =
      write_int8_checkpoint(cli.model_dir, cli.out_dir, options);
  if (!summary.ok()) {
    progress.abandon();
    std::fprintf(stderr, "error: %s\n", summary.status().message().c_str());
    return kExitFailure;
  }
  progress.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "wrote %s: %lld tensors quantized, %lld kept, %.2f GB -> %.2f GB of tensors in "
               "%.1f s\n",
               cli.out_dir.c_str(), static_cast<long long>(summary->quantized_tensors),
               static_cast<long long>(summary->kept_tensors),
               static_cast<double>(summary->bytes_in) / 1e9,
               static_cast<double>(summary->bytes_out) / 1e9, seconds);
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand(
      "quantize",
      "Write an INT8 (W8A8) copy of a checkpoint: attention and MLP/expert weights in INT8 per "
      "output channel (round to nearest, or calibrated with --calib: smoothing folded into the "
      "norms, scale search, clipping), kv_b and embeddings unchanged; "
      "serve/generate/score load it like any checkpoint (docs/quantization.md)");
  auto cli = std::make_shared<QuantizeCli>();
  sub->add_option("--model", cli->model_dir,
                  "Source checkpoint directory (BF16, F16, F32 or block-FP8; --calib needs BF16)")
      ->required();
  sub->add_option("--out", cli->out_dir,
                  "Output directory: must not exist, or be empty (nothing is overwritten); written "
                  "whole or not at all")
      ->required();
  sub->add_option("--scheme", cli->scheme,
                  "Quantization scheme: w8a8 (INT8 weights per output channel, activations "
                  "per token at run time)")
      ->check(CLI::IsMember({"w8a8"}))
      ->capture_default_str();
  sub->add_option("--lm-head", cli->lm_head,
                  "The output heads (lm_head, MTP head): int8 (measured at no perplexity cost, "
                  "half the bytes of the largest batch-1 read) or bf16")
      ->check(CLI::IsMember({"int8", "bf16"}))
      ->capture_default_str();
  CLI::Option* calib = sub->add_option(
      "--calib", cli->calib,
      "Calibration text (UTF-8; e.g. /usr/share/common-licenses/Apache-2.0, not the "
      "text you evaluate on): the BF16 model runs over it and the pipeline steps "
      "choose their transforms on the recorded layer inputs (docs/quantization.md); needs a "
      "BF16 source and a calibrating --pipeline (not rtn)");
  sub->add_option("--pipeline", cli->pipeline,
                  "Calibration steps: rtn (round to nearest, no calibration), smooth "
                  "(SmoothQuant, alpha 0.5, power-of-two scales folded into the RMSNorm and "
                  "router), search (smoothing with alpha searched per norm group), clip "
                  "(per-row clipping ratio searched), compensate (error compensation: the mean "
                  "output error per row, added back, where it lowers held-out error), or "
                  "steps joined by '+' (smooth+clip, search+clip, full+compensate, ...); full "
                  "= search+clip. Default: full with --calib, else rtn");
  sub->add_option("--calib-tokens", cli->calib_tokens,
                  "At most this many calibration tokens (windows of 256; up to 4194304, of "
                  "which 64 bytes of text each are read); with --calib")
      ->needs(calib)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22))
      ->capture_default_str();
  sub->add_option("--calib-rows", cli->calib_rows,
                  "Input rows sampled per weight for the error objective; with --calib")
      ->needs(calib)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  add_threads_option(sub, &cli->threads);
  sub->add_flag("--calib-report", cli->report,
                "Print each group's objective and choice; with --calib")
      ->needs(calib);
  sub->callback([cli] { set_command_exit_code(run_quantize(*cli)); });
});

}  // namespace
}  // namespace peerserve
