// --speculative off|mtp|auto and --num-speculative-tokens K for serve and generate:
// speculative decoding with the checkpoint's MTP layer (docs/speculative_decoding.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/model_options.h"
#include "runtime/speculative_policy.h"

namespace peerserve {

struct SpeculativeCli {
  std::string method = "off";
  int32_t num_tokens = 1;
  // --speculative-draft-quantization: the MTP layer's own precision (int8 or none).
  std::string draft_quantization = "int8";
  // The --num-speculative-tokens option (set by add_speculative_options): whether it was given.
  const CLI::Option* num_tokens_option = nullptr;
  const CLI::Option* draft_quantization_option = nullptr;
};

struct SpeculativeSetting {
  int32_t num_tokens = 0;  // K; 0 = off
  // auto: K = 1, where and whether to draft decided by measuring this machine at start-up
  // (runtime/speculative_policy.h).
  bool automatic = false;
};

void add_speculative_options(CLI::App* command, SpeculativeCli* cli);

// The flags' own checks, before any model is loaded (resolve_speculative_options runs them too).
Status check_speculative_flags(const SpeculativeCli& cli);

// ModelOptions::quantize_draft from --speculative-draft-quantization, when speculation can
// run (mtp or auto): an MTP layer that never drafts is not worth quantizing.
void apply_draft_quantization(const SpeculativeCli& cli, ModelOptions* options);

// The setting for a model with (or without) an MTP layer. Errors: mtp without an MTP layer,
// K outside 1..kMaxSpeculativeTokens, K given without --speculative mtp.
Result<SpeculativeSetting> resolve_speculative_options(const SpeculativeCli& cli,
                                                       bool model_has_mtp);

// The batch sizes auto measures, up to max_num_seqs.
std::vector<int32_t> speculative_calibration_batches(int32_t max_num_seqs);

}  // namespace peerserve
