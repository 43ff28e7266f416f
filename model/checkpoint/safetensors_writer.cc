#include "model/checkpoint/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace peerserve {

std::string safetensors_header_bytes(const std::vector<TensorToWrite>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();  // std::map inside: keys sorted
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    PS_CHECK_EQ(t.bytes.size(), static_cast<size_t>(numel) * dtype_size(t.dtype)) << t.name;
    PS_CHECK(!header.contains(t.name)) << "duplicate tensor " << t.name;
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  return frame_safetensors_header(header.dump());
}

std::string frame_safetensors_header(std::string json_text) {
  // Pad with spaces so that the data section (and so every tensor of an aligned dtype) starts
  // 8-byte aligned, as the Hugging Face writer does.
  json_text.append((8 - json_text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json_text.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json_text;
}

Status write_safetensors_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error(path + ": cannot create: " + std::strerror(errno));
  const std::string header = safetensors_header_bytes(tensors, metadata);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return io_error(path + ": write failed");
  return ok_status();
}

Status write_safetensors_index(const std::string& path, uint64_t total_size,
                               const std::map<std::string, std::string>& weight_map) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = nlohmann::json(weight_map);
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error(path + ": cannot create: " + std::strerror(errno));
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return io_error(path + ": write failed");
  return ok_status();
}

}  // namespace peerserve
