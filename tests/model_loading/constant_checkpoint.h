// A checkpoint of `config`'s layout whose BF16 tensors hold one repeated byte, written into a
// scratch folder: for tests of what loading costs in memory, where the values do not matter.
#pragma once

#include <cstdint>
#include <vector>

#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_model.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve::testing {

// Writes config.json and model.safetensors into `dir`; returns the tensors' bytes (0 when the
// write failed).
inline uint64_t write_constant_checkpoint(const ScratchDir& dir, const ModelConfig& config,
                                          std::byte value) {
  write_file_bytes(dir.file("config.json"), model_config_to_json(config));
  uint64_t bytes = 0;
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    tensors.push_back({spec.name, DType::kBF16, spec.shape,
                       std::vector<std::byte>(static_cast<size_t>(n) * 2, value)});
    bytes += tensors.back().bytes.size();
  }
  if (!write_safetensors_file(dir.file("model.safetensors"), tensors).ok()) return 0;
  return bytes;
}

}  // namespace peerserve::testing
