// Writes safetensors files (and the sharded index) in the layout Hugging Face produces: the
// JSON header keys sorted, padded with spaces to a multiple of 8 bytes so that every tensor
// starts 8-byte aligned in the file, tensors stored in the order they were added.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace peerserve {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;  // numel x dtype_size(dtype) bytes, little-endian
};

// Frames a header's JSON text as safetensors stores it: padded with spaces so that the data
// section starts 8-byte aligned, preceded by its 8-byte little-endian length.
std::string frame_safetensors_header(std::string json_text);

// The serialized header (8-byte length + padded JSON) for `tensors` laid out back to back.
// REQUIRES: every tensor's byte size matches its shape and dtype; names are unique.
std::string safetensors_header_bytes(const std::vector<TensorToWrite>& tensors,
                                     const std::map<std::string, std::string>& metadata);

// Writes one complete safetensors file. Errors name the path.
Status write_safetensors_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map":
// {tensor name: shard file name}}.
Status write_safetensors_index(const std::string& path, uint64_t total_size,
                               const std::map<std::string, std::string>& weight_map);

}  // namespace peerserve
