// Random-weight DeepSeek-V3 checkpoints in exactly the Hugging Face layout (config.json,
// sharded safetensors + model.safetensors.index.json, tokenizer.json, tokenizer_config.json,
// generation_config.json), so that tests, benchmarks and the demo never need a download.
// Shapes of the presets are documented in docs/test_models.md.
//
// Output is bit-reproducible from the seed on any machine: weights come from our own
// SplitMix64 generator and Box-Muller transform (deterministic_normal.h), not std
// distributions or libm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "model/checkpoint/checkpoint.h"
#include "model/model_config.h"

namespace peerserve {

enum class TestModelPreset {
  kTiny,    // a few hundred K parameters, for fast tests
  kMini,    // ~0.5 B parameters, for meaningful benchmarks
  kTinyV2,  // tiny's shapes as DeepSeek-V2: q_proj, softmax group-limited routing, no MTP
};

// "tiny" / "mini" / "tiny-v2"; InvalidArgument otherwise.
Result<TestModelPreset> parse_test_model_preset(std::string_view name);
std::string_view test_model_preset_name(TestModelPreset preset);

// The preset's config. With fp8, quantization_config is set (tiny: weight_block_size
// [32, 32] so that several matrices end in partial edge blocks; mini: [128, 128]).
ModelConfig test_model_config(TestModelPreset preset, bool fp8);

struct TestModelOptions {
  TestModelPreset preset = TestModelPreset::kTiny;
  uint64_t seed = 0;  // Default: 0
  bool fp8 = false;   // linear weights as F8_E4M3 + F32 weight_scale_inv. Default: false
  // Shard size limit in bytes; 0 = the preset's default (tiny: 256 KiB, so it has several
  // shards; mini: 256 MiB).
  uint64_t max_shard_bytes = 0;
  LoadProgressCallback progress;  // (bytes written, total bytes). Default: none
};

// Writes the checkpoint into `out_dir` (created if missing; existing files overwritten).
Status write_test_model(const std::string& out_dir, const TestModelOptions& options);

}  // namespace peerserve
