#include "tests/model/test_checkpoints.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/check.h"
#include "model/checkpoint/test_model.h"

namespace peerserve::testing {
namespace {

struct TempDirs {
  std::vector<std::string> paths;
  ~TempDirs() {
    std::error_code ec;
    for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
  }
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string shipped_model_dir() {
  return std::string(PEERSERVE_TEST_MODEL_DIR) + "/../../models/peerserve-dsv3-tiny";
}

std::string make_temp_dir(const std::string& tag) {
  static int counter = 0;
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("peerserve_model_test_" + std::to_string(getpid()) +
                                                "_" + tag + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  temp_dirs().paths.push_back(path.string());
  return path.string();
}

const std::string& tiny_checkpoint_dir(bool fp8) {
  static std::map<bool, std::string> dirs;
  auto it = dirs.find(fp8);
  if (it != dirs.end()) return it->second;
  const std::string dir = make_temp_dir(fp8 ? "tiny_fp8" : "tiny");
  TestModelOptions options;
  options.preset = TestModelPreset::kTiny;
  options.seed = 7;
  options.fp8 = fp8;
  const Status status = write_test_model(dir, options);
  PS_CHECK(status.ok()) << status.to_string();
  return dirs.emplace(fp8, dir).first->second;
}

}  // namespace peerserve::testing
