#include "model/checkpoint_fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

namespace peerserve {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;

void mix(uint64_t* h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    *h ^= p[i];
    *h *= kFnvPrime;
  }
}

Status mix_range(std::ifstream& in, uint64_t offset, uint64_t length, std::vector<char>* buffer,
                 uint64_t* h) {
  buffer->resize(length);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(buffer->data(), static_cast<std::streamsize>(length));
  if (!in)
    return io_error("reading " + std::to_string(length) + " bytes at " + std::to_string(offset));
  mix(h, buffer->data(), buffer->size());
  return ok_status();
}

}  // namespace

Result<std::string> checkpoint_fingerprint(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      files.push_back(entry.path());
    }
  }
  if (ec) return io_error("listing " + model_dir + ": " + ec.message());
  if (files.empty()) return not_found("no *.safetensors file in " + model_dir);
  std::sort(files.begin(), files.end());
  uint64_t h = kFnvOffset;
  std::vector<char> buffer;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const uint64_t size = fs::file_size(file, ec);
    if (ec) return io_error(file.string() + ": " + ec.message());
    mix(&h, name.data(), name.size());
    mix(&h, &size, sizeof size);
    std::ifstream in(file, std::ios::binary);
    if (!in) return io_error("cannot open " + file.string());
    // The header: an 8-byte length, then that much JSON (bounded: a corrupt length is the
    // loader's error to report; here it only limits what is hashed).
    uint64_t header = 0;
    if (size >= 8) {
      in.read(reinterpret_cast<char*>(&header), 8);
      header = std::min<uint64_t>(header, std::min<uint64_t>(size - 8, 1 << 24));
      if (Status s = mix_range(in, 8, header, &buffer, &h); !s.ok()) {
        return io_error(file.string() + ": " + s.message());
      }
    }
    const uint64_t data_begin = size >= 8 ? 8 + header : size;
    const uint64_t data = size - data_begin;
    constexpr uint64_t kWindows = 16, kWindow = 4096;
    for (uint64_t w = 0; w < kWindows && data > 0; ++w) {
      const uint64_t length = std::min(kWindow, data);
      const uint64_t offset = data_begin + (data - length) * w / (kWindows - 1);
      if (Status s = mix_range(in, offset, length, &buffer, &h); !s.ok()) {
        return io_error(file.string() + ": " + s.message());
      }
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(hex);
}

}  // namespace peerserve
