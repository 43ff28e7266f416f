// Shared by `peerserve plan` and `peerserve simulate`: finding the data folder and loading the
// hardware and model profiles that the user names. Header-only because apps/ builds only
// main.cc, command_registry.cc and cmd_*.cc.
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/whole_number_validator.h"
#include "base/regular_file.h"
#include "base/status.h"
#include "plan/analytic/deployment_presets.h"
#include "plan/analytic/routing_imbalance.h"
#include "plan/placement/expert_routing_load.h"
#include "plan/placement/routing_trace.h"
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

// "a, b, c" (for --help texts).
inline std::string joined_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Profiles, configs and routing traces are small (a published trace is a few MB): a bound
// keeps a wrong path (/dev/zero, a checkpoint shard) an error instead of an endless read.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{256} << 20;

inline Result<nlohmann::json> read_json_file(const fs::path& path) {
  PS_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxInputFileBytes));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
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

// --memory-pool-path if given, else the hardware's first caching-pool path ("ub" on the
// Ascend profile), else "ub" (only used when prompts hit the context cache).
inline std::string memory_pool_path(const plan::HardwareProfile& hw, const std::string& flag) {
  if (!flag.empty()) return flag;
  if (hw.memory_pool_paths.count("ub")) return "ub";
  return hw.memory_pool_paths.empty() ? std::string("ub") : hw.memory_pool_paths.begin()->first;
}

// The flags that pick and adjust the prefill and decode deployments, shared by both commands.
struct DeploymentFlags {
  std::string decode_preset = "cloudmatrix-decode";
  std::string prefill_preset = "cloudmatrix-prefill";
  std::optional<int> decode_devices, decode_redundant, decode_shared_devices;
  std::optional<int> prefill_devices, prefill_redundant, attention_tp;
  std::string weights, attention, kv_cache, dispatch, combine;
  std::string microbatching;
  std::optional<int> mtp_drafts;
  std::optional<double> mtp_acceptance;
  double imbalance = 1.0;
  std::string routing;  // "", "uniform", "skewed:H", "trace:FILE[,FILE...]"
  std::optional<double> prefill_tokens_per_device;

  void add_to(CLI::App& app) {
    constexpr const char* kPrecisions = "fp4, fp8, int8, bf16, fp16 or fp32";
    app.add_option("--decode-preset", decode_preset,
                   "decode deployment preset: " + joined_names(plan::decode_preset_names()) +
                       "; the deployment flags below default to its values")
        ->capture_default_str();
    app.add_option("--prefill-preset", prefill_preset,
                   "prefill deployment preset: " + joined_names(plan::prefill_preset_names()) +
                       "; the prefill flags below default to its values")
        ->capture_default_str();
    app.add_option("--decode-devices", decode_devices,
                   "devices (EP ranks) per decode instance (default: the decode preset's)");
    app.add_option("--decode-redundant", decode_redundant,
                   "redundant routed experts in decode (default: the decode preset's)");
    app.add_option("--decode-shared-devices", decode_shared_devices,
                   "decode devices holding only a shared expert (0: on every rank; default: the "
                   "decode preset's)");
    app.add_option("--prefill-devices", prefill_devices,
                   "devices per prefill instance (default: the prefill preset's)");
    app.add_option("--prefill-redundant", prefill_redundant,
                   "redundant routed experts in prefill (default: the prefill preset's)");
    app.add_option("--attention-tp", attention_tp,
                   "prefill attention TP degree (default: the prefill preset's)");
    app.add_option("--weights", weights,
                   std::string("GEMM precision: ") + kPrecisions + " (default: the presets')");
    app.add_option("--attention", attention,
                   std::string("attention precision: ") + kPrecisions + " (default: the presets')");
    app.add_option("--kv-cache", kv_cache,
                   std::string("KV cache precision: ") + kPrecisions + " (default: the presets')");
    app.add_option(
        "--dispatch", dispatch,
        std::string("dispatch payload precision: ") + kPrecisions + " (default: the presets')");
    app.add_option(
        "--combine", combine,
        std::string("combine payload precision: ") + kPrecisions + " (default: the presets')");
    app.add_option("--microbatching", microbatching, "on, off or auto (default: the presets')");
    app.add_option("--mtp-drafts", mtp_drafts,
                   "MTP draft tokens per step, 0: off (default: the decode preset's)");
    app.add_option("--mtp-acceptance", mtp_acceptance,
                   "MTP acceptance probability, 0..1 (default: the decode preset's)");
    app.add_option("--imbalance", imbalance, "max/mean tokens per expert rank (1: perfect EPLB)")
        ->capture_default_str();
    app.add_option("--routing", routing,
                   "expert routing instead of --imbalance: uniform, skewed:H (hottest expert H x "
                   "the mean), or trace:FILE[,FILE...] (published per-request JSON traces); "
                   "placed EPLB-style on each deployment");
    app.add_option("--prefill-tokens-per-device", prefill_tokens_per_device,
                   "prefill batch budget per device, tokens (default: the prefill preset's)");
  }

  Status apply_precisions(plan::PrecisionPlan& p) const {
    auto set = [](const std::string& name, plan::Precision& field) -> Status {
      if (name.empty()) return ok_status();
      PS_ASSIGN_OR_RETURN(field, plan::parse_precision(name));
      return ok_status();
    };
    PS_RETURN_IF_ERROR(set(weights, p.weights));
    PS_RETURN_IF_ERROR(set(attention, p.attention));
    PS_RETURN_IF_ERROR(set(kv_cache, p.kv_cache));
    PS_RETURN_IF_ERROR(set(dispatch, p.dispatch));
    PS_RETURN_IF_ERROR(set(combine, p.combine));
    return ok_status();
  }

  // A model without an MTP module drafts nothing: the preset's MTP is dropped for it, and
  // --mtp-drafts > 0 is refused.
  Result<plan::DecodeDeployment> decode(const plan::ModelProfile& model) const {
    PS_ASSIGN_OR_RETURN(plan::DecodeDeployment d, plan::decode_preset(decode_preset));
    if (decode_devices) d.experts.devices = *decode_devices;
    if (decode_redundant) d.experts.redundant_experts = *decode_redundant;
    if (decode_shared_devices) d.experts.shared_expert_devices = *decode_shared_devices;
    d.experts.expert_imbalance = imbalance;
    PS_RETURN_IF_ERROR(apply_precisions(d.precision));
    if (!microbatching.empty()) {
      PS_ASSIGN_OR_RETURN(d.microbatching, plan::parse_microbatching(microbatching));
    }
    if (mtp_drafts) d.mtp.draft_tokens = *mtp_drafts;
    if (mtp_acceptance) d.mtp.acceptance = *mtp_acceptance;
    if (model.num_mtp_layers == 0 && d.mtp.draft_tokens > 0) {
      if (mtp_drafts) {
        return invalid_argument("--mtp-drafts " + std::to_string(*mtp_drafts) + ": model '" +
                                model.name + "' has no MTP module to draft with");
      }
      d.mtp.draft_tokens = 0;
    }
    return d;
  }

  Result<plan::PrefillDeployment> prefill() const {
    PS_ASSIGN_OR_RETURN(plan::PrefillDeployment d, plan::prefill_preset(prefill_preset));
    if (prefill_devices) d.experts.devices = *prefill_devices;
    if (prefill_redundant) d.experts.redundant_experts = *prefill_redundant;
    if (attention_tp) d.attention_tp = *attention_tp;
    if (prefill_tokens_per_device) d.max_tokens_per_device = *prefill_tokens_per_device;
    d.experts.expert_imbalance = imbalance;
    PS_RETURN_IF_ERROR(apply_precisions(d.precision));
    if (!microbatching.empty()) {
      PS_ASSIGN_OR_RETURN(d.microbatching, plan::parse_microbatching(microbatching));
    }
    return d;
  }
};

// Replaces both deployments' expert_imbalance by what `flags.routing` gives after EPLB-style
// placement (prefill rows of traces for prefill, decode steps for decode). No-op when empty.
inline Status apply_routing(const DeploymentFlags& flags, const plan::ModelProfile& model,
                            plan::PrefillDeployment& prefill, plan::DecodeDeployment& decode) {
  const std::string& spec = flags.routing;
  if (spec.empty()) return ok_status();
  plan::ExpertRoutingLoad prefill_load;
  plan::ExpertRoutingLoad decode_load;
  if (spec == "uniform" || spec.rfind("skewed:", 0) == 0) {
    double hottest = 1.0;
    if (spec != "uniform") {
      // The whole rest must be the number (stod took "4garbage" as 4), and a finite one >= 1
      // (NaN failed both range checks and read as uniform).
      if (!parse_finite_number(spec.substr(7), &hottest) || hottest < 1.0) {
        return invalid_argument("--routing '" + spec +
                                "': expected skewed:H with a finite number H >= 1");
      }
    }
    PS_ASSIGN_OR_RETURN(prefill_load, plan::skewed_routing_load(model, hottest, 1e6, 1));
    decode_load = prefill_load;
  } else if (spec.rfind("trace:", 0) == 0) {
    std::vector<plan::RequestRouting> requests;
    std::stringstream paths(spec.substr(6));
    std::string path;
    while (std::getline(paths, path, ',')) {
      Result<std::string> text = read_regular_file(path, kMaxInputFileBytes);
      if (!text.ok()) return text.status().with_context("--routing trace");
      plan::RoutingTraceParseOptions options;
      options.num_experts = model.num_routed_experts;
      auto request = plan::parse_routing_trace(*text, options);
      if (!request.ok()) return request.status().with_context(path);
      requests.push_back(std::move(*request));
    }
    if (requests.empty()) return invalid_argument("--routing trace: names no files");
    PS_ASSIGN_OR_RETURN(prefill_load,
                        plan::expert_load_from_routing(requests, model.num_routed_experts,
                                                       plan::RoutingPhase::kPrefill));
    PS_ASSIGN_OR_RETURN(decode_load,
                        plan::expert_load_from_routing(requests, model.num_routed_experts,
                                                       plan::RoutingPhase::kDecode));
  } else {
    return invalid_argument("--routing '" + spec +
                            "': expected uniform, skewed:H or trace:FILE[,FILE...]");
  }
  PS_ASSIGN_OR_RETURN(auto p, plan::routing_imbalance(prefill_load, model, prefill.experts));
  PS_ASSIGN_OR_RETURN(auto d, plan::routing_imbalance(decode_load, model, decode.experts));
  prefill.experts.expert_imbalance = p.mean_max_over_mean;
  decode.experts.expert_imbalance = d.mean_max_over_mean;
  return ok_status();
}

}  // namespace peerserve::plan_inputs
