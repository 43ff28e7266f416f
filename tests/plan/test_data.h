// Locating the repository's data/ folder from tests (ctest sets PEERSERVE_SOURCE_DIR).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/profiles/hardware_profile.h"
#include "plan/report/paper_reproduction.h"

namespace peerserve::plan::testing {

inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("PEERSERVE_SOURCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir)
                        : std::filesystem::path(PEERSERVE_TEST_SOURCE_DIR);
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

inline HardwareSet load_hardware_set() {
  HardwareSet set;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "data/hardware")) {
    auto hw = hardware_profile_from_json(read_json(entry.path()), entry.path().string());
    if (hw.ok()) set.emplace(hw->name, *hw);
  }
  return set;
}

}  // namespace peerserve::plan::testing
