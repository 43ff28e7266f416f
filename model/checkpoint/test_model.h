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
#include <optional>
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
  kV2Lite,  // exactly DeepSeek-V2-Lite's shapes and routing (15.7 B parameters, 2.4 B active)
};

// "tiny" / "mini" / "tiny-v2" / "v2-lite"; InvalidArgument otherwise.
Result<TestModelPreset> parse_test_model_preset(std::string_view name);
std::string_view test_model_preset_name(TestModelPreset preset);

// The preset's config. With fp8, quantization_config is set (tiny: weight_block_size
// [32, 32] so that several matrices end in partial edge blocks; mini, v2-lite: [128, 128]).
ModelConfig test_model_config(TestModelPreset preset, bool fp8);

struct TestModelOptions {
  TestModelPreset preset = TestModelPreset::kTiny;
  uint64_t seed = 0;  // Default: 0
  bool fp8 = false;   // linear weights as F8_E4M3 + F32 weight_scale_inv. Default: false
  // Overrides the preset's num_hidden_layers (the MTP layer, if any, follows the last one).
  // Must be >= 1. Default: the preset's.
  std::optional<int> num_layers;
  // Shard size limit in bytes; 0 = the preset's default (tiny, tiny-v2: 256 KiB, so they
  // have several shards; mini: 256 MiB; v2-lite: 2 GiB).
  uint64_t max_shard_bytes = 0;
  // Threads that generate the tensors of a shard; the bytes do not depend on it. 0 = all
  // cores. Default: 0
  int num_threads = 0;
  // Values per generation part of a BF16/F32 tensor; the bytes do not depend on it (tests
  // use small odd sizes, so that parts start anywhere in a stream). 0 = 1 M. Default: 0
  int64_t part_values = 0;
  // (bytes generated, total bytes), called from the writing threads, one call at a time.
  // Default: none
  LoadProgressCallback progress;
};

// test_model_config(options.preset, options.fp8) with options.num_layers applied;
// InvalidArgument if num_layers is < 1.
Result<ModelConfig> test_model_config(const TestModelOptions& options);

// Writes the checkpoint into `out_dir` (created if missing; existing files overwritten).
// Shards are written one after another; the tensors of a shard are generated in parallel
// (large tensors in parts of part_values: each tensor's stream can start anywhere) and each
// part is written at its offset in the file as soon as it is done, so memory stays at a few
// parts per thread (a whole tensor for FP8). The bytes are the same for any num_threads.
Status write_test_model(const std::string& out_dir, const TestModelOptions& options);

}  // namespace peerserve
