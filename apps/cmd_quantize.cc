// peerserve quantize: writes an INT8 (W8A8) copy of a checkpoint (model/int8_checkpoint.h,
// docs/quantization.md) that serve, generate, score and the benches load like any other.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/command_registry.h"
#include "apps/load_progress_bar.h"
#include "model/int8_checkpoint.h"

namespace peerserve {
namespace {

struct QuantizeCli {
  std::string model_dir;
  std::string out_dir;
  std::string scheme = "w8a8";
  std::string lm_head = "int8";
};

int run_quantize(const QuantizeCli& cli) {
  Int8CheckpointOptions options;
  options.lm_head = cli.lm_head == "int8";
  LoadProgressBar progress("quantizing");
  options.progress = progress.callback();
  std::fprintf(stderr, "quantizing %s to %s (W8A8: INT8 weights per output channel, lm_head %s)\n",
               cli.model_dir.c_str(), cli.out_dir.c_str(), cli.lm_head.c_str());
  const auto start = std::chrono::steady_clock::now();
  Result<Int8CheckpointSummary> summary =
      write_int8_checkpoint(cli.model_dir, cli.out_dir, options);
  if (!summary.ok()) {
    std::fprintf(stderr, "error: %s\n", summary.status().message().c_str());
    return 1;
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
      "output channel (round to nearest), norms, router, kv_b and embeddings unchanged; "
      "serve/generate/score load it like any checkpoint (docs/quantization.md)");
  auto cli = std::make_shared<QuantizeCli>();
  sub->add_option("--model", cli->model_dir, "Source checkpoint directory (BF16, F32 or FP8)")
      ->required();
  sub->add_option("--out", cli->out_dir, "Output directory (created; must not be the source)")
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
  sub->callback([cli] { set_command_exit_code(run_quantize(*cli)); });
});

}  // namespace
}  // namespace peerserve
