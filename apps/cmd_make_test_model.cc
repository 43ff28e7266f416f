// peerserve make-test-model: writes a random-weight DeepSeek-V3 checkpoint in the Hugging Face
// layout (docs/test_models.md), optionally re-opening it to check that it loads.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "apps/command_registry.h"
#include "apps/load_progress_bar.h"
#include "apps/whole_number_validator.h"
#include "base/staged_output_directory.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_model.h"

namespace peerserve {
namespace {

struct MakeTestModelOptions {
  std::string preset = "tiny";
  std::string out_dir;
  uint64_t seed = 0;
  bool fp8 = false;
  bool verify = false;
  std::optional<int> num_layers;
};

// Opens the checkpoint, checks its layout and reads every tensor as the model would.
Status verify_checkpoint(const std::string& dir) {
  CheckpointOptions options;
  LoadProgressBar progress("loading");
  options.progress = progress.callback();
  PS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(dir, options));
  PS_RETURN_IF_ERROR(checkpoint.validate_layout());
  for (const TensorSpec& spec : deepseek_tensor_layout(checkpoint.config())) {
    PS_RETURN_IF_ERROR(checkpoint.get_bf16(spec.name, spec.shape).status());
  }
  progress.finish();
  return checkpoint.check_all_used();
}

int run_make_test_model(const MakeTestModelOptions& cli) {
  Result<TestModelPreset> preset = parse_test_model_preset(cli.preset);
  if (!preset.ok()) {
    std::fprintf(stderr, "error: %s\n", preset.status().message().c_str());
    return kExitFailure;
  }
  TestModelOptions options;
  options.preset = *preset;
  options.seed = cli.seed;
  options.fp8 = cli.fp8;
  options.num_layers = cli.num_layers;
  Result<ModelConfig> config = test_model_config(options);
  if (!config.ok()) {
    std::fprintf(stderr, "error: --num-layers: %s\n", config.status().message().c_str());
    return kExitFailure;
  }
  if (Status status = check_output_directory(cli.out_dir); !status.ok()) {
    std::fprintf(stderr, "error: --out: %s\n", status.message().c_str());
    return kExitFailure;
  }
  LoadProgressBar progress("writing");
  options.progress = progress.callback();
  std::printf("writing %s%s test model (%lld layers, %.1f M parameters, seed %llu) to %s\n",
              cli.preset.c_str(), cli.fp8 ? " fp8" : "",
              static_cast<long long>(config->num_hidden_layers),
              static_cast<double>(model_parameter_count(*config)) / 1e6,
              static_cast<unsigned long long>(cli.seed), cli.out_dir.c_str());
  std::fflush(stdout);  // before the progress bar on stderr
  const auto start = std::chrono::steady_clock::now();
  if (Status status = write_test_model(cli.out_dir, options); !status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
    return kExitFailure;
  }
  progress.finish();
  std::printf("written in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::fflush(stdout);  // before the verification's progress bar on stderr
  if (cli.verify) {
    if (Status status = verify_checkpoint(cli.out_dir); !status.ok()) {
      std::fprintf(stderr, "error: verification failed: %s\n", status.to_string().c_str());
      return kExitFailure;
    }
    std::printf("verified: every tensor loads and matches the layout\n");
  }
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand(
      "make-test-model", "Write a random-weight DeepSeek-V3 checkpoint (Hugging Face layout)");
  auto options = std::make_shared<MakeTestModelOptions>();
  sub->add_option("--preset", options->preset,
                  "tiny (fast tests), mini (~0.5 B, benchmarks), tiny-v2 (tiny as DeepSeek-V2) "
                  "or v2-lite (DeepSeek-V2-Lite's shapes, 15.7 B; 31 GB)")
      ->check(CLI::IsMember({"tiny", "mini", "tiny-v2", "v2-lite"}))
      ->capture_default_str();
  sub->add_option("--num-layers", options->num_layers,
                  "decoder layers instead of the preset's (1..1024; v2-lite with 4: 2.25 B)");
  sub->add_option("--out", options->out_dir,
                  "output directory: must not exist or be empty (written beside it, then "
                  "renamed into place whole)")
      ->required();
  sub->add_option("--seed", options->seed, "weight seed (same seed, same bytes)")
      ->check(whole_number_at_most())
      ->capture_default_str();
  sub->add_flag("--fp8", options->fp8,
                "store linear weights as F8_E4M3 with F32 128x128 (tiny, tiny-v2: 32x32) block "
                "scales");
  sub->add_flag("--verify", options->verify,
                "re-open the checkpoint, validate its layout and read every tensor");
  sub->callback([options] { set_command_exit_code(run_make_test_model(*options)); });
});

}  // namespace
}  // namespace peerserve
