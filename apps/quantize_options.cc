#include "apps/quantize_options.h"

namespace peerserve {

void add_quantize_options(CLI::App* command, QuantizeCli* cli) {
  command
      ->add_option("--quantize", cli->scheme,
                   "Weight quantization at load: none, or int8 (W8A8: INT8 attention "
                   "projections and MLP/expert weights with per-channel scales, activations "
                   "quantized per token; docs/quantization.md)")
      ->check(CLI::IsMember({"none", "int8"}))
      ->capture_default_str();
  command->add_flag(
      "--quantize-lm-head", cli->lm_head,
      "With --quantize int8: the LM head too (halves the largest batch-1 read; measured at no "
      "perplexity cost on the shipped model, docs/quantization.md)");
  command->add_flag("--no-pack-bf16", cli->no_pack_bf16,
                    "Keep BF16 products on the checkpoint layout: no repacked copy of the BF16 "
                    "weights at load (faster load, slower products; by default they are "
                    "repacked where the kernels are faster on it: AVX512_BF16, or AVX2 without "
                    "AVX-512; docs/kernels.md)");
}

Status apply_quantize_options(const QuantizeCli& cli, ModelOptions* options) {
  if (cli.lm_head && cli.scheme != "int8") {
    return invalid_argument(
        "--quantize-lm-head quantizes the LM head at load with the rest: add "
        "--quantize int8 (an INT8 checkpoint's head is as `peerserve "
        "quantize --lm-head` wrote it)");
  }
  options->quantize = cli.scheme == "int8" ? WeightQuantization::kInt8 : WeightQuantization::kNone;
  options->quantize_lm_head = cli.lm_head;
  options->pack_bf16 = !cli.no_pack_bf16;
  return ok_status();
}

}  // namespace peerserve
