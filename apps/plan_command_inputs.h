// Shared by `peerserve plan` and `peerserve simulate`: finding the data folder and loading the
// hardware and model profiles that the user names. Header-only because apps/ builds only
// main.cc, command_registry.cc and cmd_*.cc.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"
#include "plan/report/paper_reproduction.h"

namespace peerserve::plan_inputs {

namespace fs = std::filesystem;

// --data-dir if given, else $PEERSERVE_DATA_DIR, else ./data, else the source tree's data/
// next to the binary (build/apps/peerserve -> ../../data).
inline Result<fs::path> resolve_data_dir(const std::string& flag) {
  std::error_code ec;
  if (!flag.empty()) {
    if (fs::is_directory(flag, ec)) return fs::path(flag);
    return not_found("--data-dir '" + flag + "' is not a folder");
  }
  if (const char* env = std::getenv("PEERSERVE_DATA_DIR"); env != nullptr && *env != '\0') {
    if (fs::is_directory(env, ec)) return fs::path(env);
    return not_found("PEERSERVE_DATA_DIR '" + std::string(env) + "' is not a folder");
  }
  if (fs::is_directory("data/hardware", ec)) return fs::path("data");
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate :
         {exe.parent_path() / "../../data", exe.parent_path() / "../data"}) {
      if (fs::is_directory(candidate / "hardware", ec)) return fs::weakly_canonical(candidate, ec);
    }
  }
  return not_found(
      "cannot find the data folder with hardware/*.json: pass --data-dir or set "
      "PEERSERVE_DATA_DIR");
}

inline Result<nlohmann::json> read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open '" + path.string() + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return data_loss("'" + path.string() + "' is not valid JSON");
  return json;
}

// `name_or_path`: a profile name under <data>/hardware/ or a path to a .json file.
inline Result<plan::HardwareProfile> load_hardware(const fs::path& data_dir,
                                                   const std::string& name_or_path) {
  fs::path path = name_or_path;
  if (path.extension() != ".json") path = data_dir / "hardware" / (name_or_path + ".json");
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    std::string known;
    for (const auto& entry : fs::directory_iterator(data_dir / "hardware", ec)) {
      if (entry.path().extension() == ".json") {
        known += (known.empty() ? "" : ", ") + entry.path().stem().string();
      }
    }
    return not_found("no hardware profile '" + name_or_path + "' (known: " + known + ")");
  }
  PS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(path));
  return plan::hardware_profile_from_json(json, path.string());
}

inline Result<plan::HardwareSet> load_all_hardware(const fs::path& data_dir) {
  plan::HardwareSet set;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(data_dir / "hardware", ec)) {
    if (entry.path().extension() != ".json") continue;
    PS_ASSIGN_OR_RETURN(plan::HardwareProfile hw, load_hardware(data_dir, entry.path().string()));
    set.emplace(hw.name, std::move(hw));
  }
  if (ec) return io_error("cannot list '" + (data_dir / "hardware").string() + "'");
  return set;
}

// A preset name, or a Hugging Face config.json when `config_path` is set.
inline Result<plan::ModelProfile> load_model(const std::string& preset,
                                             const std::string& config_path) {
  if (config_path.empty()) return plan::model_preset(preset);
  PS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(config_path));
  const std::string name = fs::path(config_path).parent_path().filename().string();
  return plan::model_profile_from_hf_config(json, config_path, name.empty() ? "model" : name);
}

}  // namespace peerserve::plan_inputs
