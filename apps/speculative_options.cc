#include "apps/speculative_options.h"

#include "runtime/scheduler.h"

namespace peerserve {

// `auto`: MTP with one draft while at most this many sequences run. Measured with
// bench/model/speculative_decode_bench.sh (docs/speculative_decoding.md).
constexpr int32_t kAutoMaxRunning = 4;

void add_speculative_options(CLI::App* command, SpeculativeCli* cli) {
  command
      ->add_option("--speculative", cli->method,
                   "Speculative decoding: off, mtp (the checkpoint's MTP layer drafts "
                   "--num-speculative-tokens tokens per step, verified by the main model; "
                   "output identical for greedy requests, same distribution for sampled ones), "
                   "or auto (mtp with one draft while at most " +
                       std::to_string(kAutoMaxRunning) +
                       " sequences run, where it measured faster; off without an MTP layer)")
      ->check(CLI::IsMember({"off", "mtp", "auto"}))
      ->capture_default_str();
  command
      ->add_option("--num-speculative-tokens", cli->num_tokens,
                   "Draft tokens per step with --speculative mtp (1.." +
                       std::to_string(kMaxSpeculativeTokens) +
                       "; above 1 the MTP layer runs autoregressively)")
      ->capture_default_str();
}

Result<SpeculativeSetting> resolve_speculative_options(const SpeculativeCli& cli,
                                                       bool model_has_mtp) {
  SpeculativeSetting setting;
  if (cli.num_tokens < 1 || cli.num_tokens > kMaxSpeculativeTokens) {
    return invalid_argument("--num-speculative-tokens " + std::to_string(cli.num_tokens) +
                            ": expected 1.." + std::to_string(kMaxSpeculativeTokens));
  }
  if (cli.method == "off") return setting;
  if (cli.method == "auto") {
    if (!model_has_mtp) return setting;
    setting.num_tokens = 1;
    setting.max_running = kAutoMaxRunning;
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

}  // namespace peerserve
