// The weight forms made at load, for the commands that load the model (generate, score,
// serve): --quantize none|int8 and --quantize-lm-head (W8A8, docs/quantization.md), and
// --no-pack-bf16 (keep BF16 products on the checkpoint layout, docs/kernels.md).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "base/status.h"
#include "model/model_options.h"

namespace peerserve {

struct QuantizeCli {
  std::string scheme = "none";
  bool lm_head = false;
  bool no_pack_bf16 = false;
};

void add_quantize_options(CLI::App* command, QuantizeCli* cli);
// Sets options->quantize / quantize_lm_head / pack_bf16; an error for --quantize-lm-head
// without --quantize int8 (it would be ignored).
Status apply_quantize_options(const QuantizeCli& cli, ModelOptions* options);

}  // namespace peerserve
