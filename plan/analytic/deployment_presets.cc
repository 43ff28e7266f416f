#include "plan/analytic/deployment_presets.h"

#include <map>

namespace peerserve::plan {
namespace {

PrecisionPlan cloudmatrix_precision() {
  PrecisionPlan p;
  p.weights = Precision::kInt8;
  p.attention = Precision::kBf16;
  p.kv_cache = Precision::kBf16;
  p.dispatch = Precision::kInt8;
  p.dispatch_scale_bytes = 512.0;  // §4.2.1: a 4 B scale padded to 512 B -> 7.5 KB per token
  p.combine = Precision::kBf16;
  return p;
}

PrecisionPlan hopper_fp8_precision() {
  PrecisionPlan p;
  p.weights = Precision::kFp8;
  p.attention = Precision::kBf16;
  p.kv_cache = Precision::kBf16;
  p.dispatch = Precision::kFp8;
  p.dispatch_scale_bytes = 224.0;  // one FP32 scale per 128 elements of 7168
  p.combine = Precision::kBf16;
  return p;
}

DecodeDeployment cloudmatrix_decode() {
  DecodeDeployment d;
  d.experts.devices = 320;
  d.experts.redundant_experts = 32;
  d.experts.shared_expert_devices = 32;
  d.precision = cloudmatrix_precision();
  d.microbatching = Microbatching::kOn;
  d.mtp.draft_tokens = 1;
  d.mtp.acceptance = 0.7;
  return d;
}

PrefillDeployment cloudmatrix_prefill() {
  PrefillDeployment d;
  d.experts.devices = 32;
  d.experts.redundant_experts = 32;
  d.precision = cloudmatrix_precision();
  d.microbatching = Microbatching::kOn;
  d.attention_tp = 4;
  d.max_tokens_per_device = 8192.0;
  return d;
}

DecodeDeployment deepseek_h800_decode() {
  DecodeDeployment d;
  d.experts.devices = 144;
  d.experts.redundant_experts = 32;
  d.precision = hopper_fp8_precision();
  d.microbatching = Microbatching::kOn;
  d.mtp.draft_tokens = 1;
  d.mtp.acceptance = 0.8;
  return d;
}

PrefillDeployment hopper_prefill() {
  PrefillDeployment d;
  d.experts.devices = 32;
  d.experts.redundant_experts = 32;
  d.precision = hopper_fp8_precision();
  d.microbatching = Microbatching::kOn;
  d.attention_tp = 1;
  d.dedup_per_node = true;
  d.max_tokens_per_device = 16384.0;
  return d;
}

DecodeDeployment sglang_h100_decode() {
  DecodeDeployment d;
  d.experts.devices = 72;
  d.experts.redundant_experts = 32;
  d.precision = hopper_fp8_precision();
  d.microbatching = Microbatching::kOn;
  d.mtp.draft_tokens = 1;
  d.mtp.acceptance = 0.7;
  return d;
}

const std::map<std::string, DecodeDeployment (*)()>& decode_presets() {
  static const std::map<std::string, DecodeDeployment (*)()> kPresets = {
      {"cloudmatrix-decode", &cloudmatrix_decode},
      {"deepseek-h800-decode", &deepseek_h800_decode},
      {"sglang-h100-decode", &sglang_h100_decode},
  };
  return kPresets;
}

const std::map<std::string, PrefillDeployment (*)()>& prefill_presets() {
  static const std::map<std::string, PrefillDeployment (*)()> kPresets = {
      {"cloudmatrix-prefill", &cloudmatrix_prefill},
      {"deepseek-h800-prefill", &hopper_prefill},
      {"sglang-h100-prefill", &hopper_prefill},
  };
  return kPresets;
}

template <typename Map>
std::string names_of(const Map& map) {
  std::string out;
  for (const auto& [name, make] : map) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<std::string> decode_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : decode_presets()) names.push_back(name);
  return names;
}

std::vector<std::string> prefill_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : prefill_presets()) names.push_back(name);
  return names;
}

Result<DecodeDeployment> decode_preset(std::string_view name) {
  auto it = decode_presets().find(std::string(name));
  if (it == decode_presets().end()) {
    return not_found("unknown decode preset '" + std::string(name) +
                     "', expected one of: " + names_of(decode_presets()));
  }
  return it->second();
}

Result<PrefillDeployment> prefill_preset(std::string_view name) {
  auto it = prefill_presets().find(std::string(name));
  if (it == prefill_presets().end()) {
    return not_found("unknown prefill preset '" + std::string(name) +
                     "', expected one of: " + names_of(prefill_presets()));
  }
  return it->second();
}

}  // namespace peerserve::plan
