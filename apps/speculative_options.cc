#include "apps/speculative_options.h"

#include <algorithm>

#include "runtime/scheduler.h"

namespace peerserve {

void add_speculative_options(CLI::App* command, SpeculativeCli* cli) {
  command
      ->add_option(
          "--speculative", cli->method,
          "Speculative decoding: off, mtp (the checkpoint's MTP layer drafts "
          "--num-speculative-tokens tokens per step, verified by the main model; "
          "output identical for greedy requests, same distribution for sampled ones), "
          "or auto (at start-up, times a verification step and the MTP layer against a "
          "decode step on this machine; drafts one token at the batch sizes where that "
          "predicts a gain of 5% or more at 80% acceptance, and turns off for good if "
          "fewer drafts than break-even are accepted; off without an MTP layer, with serve's "
          "--microbatches 2, and under --ep, where mtp drafts on every rank; "
          "docs/speculative_decoding.md)")
      ->check(CLI::IsMember({"off", "mtp", "auto"}))
      ->capture_default_str();
  cli->num_tokens_option = command
                               ->add_option("--num-speculative-tokens", cli->num_tokens,
                                            "Draft tokens per step with --speculative mtp (1.." +
                                                std::to_string(kMaxSpeculativeTokens) +
                                                "; above 1 the MTP layer runs autoregressively)")
                               ->capture_default_str();
  cli->draft_quantization_option =
      command
          ->add_option("--speculative-draft-quantization", cli->draft_quantization,
                       "Precision of the drafter (the MTP layer and its head) with --speculative "
                       "mtp or auto: int8 (W8A8 at load, round to nearest: half the bytes per "
                       "draft, so speculation costs less and pays at more batch sizes; a head "
                       "shared with a BF16 LM head gets its own INT8 copy) or none (as the main "
                       "model). Drafts only choose what the main model verifies: outputs are the "
                       "same either way")
          ->check(CLI::IsMember({"int8", "none"}))
          ->capture_default_str();
}

void apply_draft_quantization(const SpeculativeCli& cli, ModelOptions* options) {
  if (cli.method != "off" && cli.draft_quantization == "int8") {
    options->quantize_draft = WeightQuantization::kInt8;
  }
}

Status check_speculative_flags(const SpeculativeCli& cli) {
  if (cli.num_tokens < 1 || cli.num_tokens > kMaxSpeculativeTokens) {
    return invalid_argument("--num-speculative-tokens " + std::to_string(cli.num_tokens) +
                            ": expected 1.." + std::to_string(kMaxSpeculativeTokens));
  }
  if (cli.num_tokens_option != nullptr && cli.num_tokens_option->count() > 0 &&
      cli.method != "mtp") {
    // off drafts nothing and auto drafts one: the count would be ignored.
    return invalid_argument(
        "--num-speculative-tokens is for --speculative mtp (this is --speculative " + cli.method +
        ")");
  }
  if (cli.draft_quantization_option != nullptr && cli.draft_quantization_option->count() > 0 &&
      cli.method == "off") {
    return invalid_argument(
        "--speculative-draft-quantization is for --speculative mtp or auto (this is "
        "--speculative off)");
  }
  return ok_status();
}

Result<SpeculativeSetting> resolve_speculative_options(const SpeculativeCli& cli,
                                                       bool model_has_mtp) {
  SpeculativeSetting setting;
  PS_RETURN_IF_ERROR(check_speculative_flags(cli));
  if (cli.method == "off") return setting;
  if (cli.method == "auto") {
    if (!model_has_mtp) return setting;
    setting.num_tokens = 1;
    setting.automatic = true;
    return setting;
  }
  if (cli.method != "mtp") {
    return invalid_argument("--speculative '" + cli.method + "': expected off, mtp or auto");
  }
  if (!model_has_mtp) {
    return invalid_argument(
        "--speculative mtp: the checkpoint has no MTP layer (num_nextn_predict_layers is 0)");
  }
  setting.num_tokens = cli.num_tokens;
  return setting;
}

std::vector<int32_t> speculative_calibration_batches(int32_t max_num_seqs) {
  std::vector<int32_t> batches;
  for (int32_t b = 1; b <= std::min(max_num_seqs, 32); b *= 2) batches.push_back(b);
  return batches;
}

}  // namespace peerserve
