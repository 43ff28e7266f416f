// --quantize none|int8 and --quantize-lm-head for the commands that load the model
// (generate, score, serve): W8A8 at load time (docs/quantization.md).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "model/model_options.h"

namespace peerserve {

struct QuantizeCli {
  std::string scheme = "none";
  bool lm_head = false;
};

void add_quantize_options(CLI::App* command, QuantizeCli* cli);
// Sets options->quantize / quantize_lm_head.
void apply_quantize_options(const QuantizeCli& cli, ModelOptions* options);

}  // namespace peerserve
