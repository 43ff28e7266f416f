// Helpers for caching-pool tests: deterministic block contents and a scratch folder.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace peerserve::testing {

// `size` bytes that depend on (seed, position): two blocks with different seeds differ in
// almost every byte, so a block returned for the wrong key or torn between two writers is
// caught by block_matches().
inline std::vector<std::byte> make_block(uint64_t seed, size_t size) {
  std::vector<std::byte> out(size);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

inline bool block_matches(const std::vector<std::byte>& block, uint64_t seed) {
  return block == make_block(seed, block.size());
}

// A fresh empty folder under the system temp folder, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path_ =
        std::filesystem::temp_directory_path() /
        ("peerserve_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace peerserve::testing
