// --speculative off|mtp|auto and --num-speculative-tokens K for serve and generate:
// speculative decoding with the checkpoint's MTP layer (docs/speculative_decoding.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "base/status.h"

namespace peerserve {

struct SpeculativeCli {
  std::string method = "off";
  int32_t num_tokens = 1;
};

struct SpeculativeSetting {
  int32_t num_tokens = 0;  // K; 0 = off
  // Drafts are verified only while at most this many sequences run (0 = always); above it
  // the MTP layer still runs, to keep its KV, but drafts nothing.
  int32_t max_running = 0;
};

void add_speculative_options(CLI::App* command, SpeculativeCli* cli);

// The setting for a model with (or without) an MTP layer. Errors: mtp without an MTP layer,
// K outside 1..kMaxSpeculativeTokens.
Result<SpeculativeSetting> resolve_speculative_options(const SpeculativeCli& cli,
                                                       bool model_has_mtp);

}  // namespace peerserve
