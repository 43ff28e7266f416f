#include "plan/analytic/deployment.h"

#include <cmath>
#include <string>

namespace peerserve::plan {

std::string_view microbatching_name(Microbatching mode) {
  switch (mode) {
    case Microbatching::kOff:
      return "off";
    case Microbatching::kOn:
      return "on";
    case Microbatching::kAuto:
      return "auto";
  }
  return "?";
}

Result<Microbatching> parse_microbatching(std::string_view name) {
  if (name == "off") return Microbatching::kOff;
  if (name == "on") return Microbatching::kOn;
  if (name == "auto") return Microbatching::kAuto;
  return invalid_argument("microbatching '" + std::string(name) + "' is not one of off, on, auto");
}

double MtpOptions::tokens_per_step() const {
  double tokens = 1.0;
  double chain = 1.0;
  for (int i = 0; i < draft_tokens; ++i) {
    chain *= acceptance;
    tokens += chain;
  }
  return tokens;
}

Status validate_placement(const ExpertPlacement& p, const ModelProfile& model) {
  if (p.devices < 1 || p.devices > kMaxDevices) {
    return invalid_argument("expert placement: devices = " + std::to_string(p.devices) +
                            ", expected 1.." + std::to_string(kMaxDevices));
  }
  if (p.redundant_experts < 0 || p.redundant_experts > kMaxRedundantExperts) {
    return invalid_argument(
        "expert placement: redundant_experts = " + std::to_string(p.redundant_experts) +
        ", expected 0.." + std::to_string(kMaxRedundantExperts));
  }
  if (p.shared_expert_devices < 0 || p.shared_expert_devices >= p.devices) {
    return invalid_argument(
        "expert placement: shared_expert_devices = " + std::to_string(p.shared_expert_devices) +
        ", expected in [0, " + std::to_string(p.devices - 1) + "]");
  }
  if (p.shared_expert_devices > 0 && model.num_shared_experts == 0) {
    return invalid_argument(
        "expert placement: shared_expert_devices = " + std::to_string(p.shared_expert_devices) +
        " but model '" + model.name + "' has no shared expert");
  }
  const int routed_devices = p.devices - p.shared_expert_devices;
  const int slots = model.num_routed_experts + p.redundant_experts;
  if (slots % routed_devices != 0) {
    return invalid_argument("expert placement: " + std::to_string(slots) +
                            " routed expert slots (" + std::to_string(model.num_routed_experts) +
                            " experts + " + std::to_string(p.redundant_experts) +
                            " redundant) do not divide evenly over " +
                            std::to_string(routed_devices) + " routed-expert devices");
  }
  if (!(p.expert_imbalance >= 1.0) || !std::isfinite(p.expert_imbalance)) {
    return invalid_argument("expert placement: expert_imbalance = " +
                            std::to_string(p.expert_imbalance) + ", expected max/mean load >= 1");
  }
  return ok_status();
}

Status validate_decode_deployment(const DecodeDeployment& d, const ModelProfile& model) {
  PS_RETURN_IF_ERROR(validate_placement(d.experts, model));
  if (d.mtp.draft_tokens < 0 || d.mtp.draft_tokens > 8) {
    return invalid_argument("mtp draft_tokens = " + std::to_string(d.mtp.draft_tokens) +
                            ", expected 0..8");
  }
  if (!(d.mtp.acceptance >= 0.0 && d.mtp.acceptance <= 1.0)) {
    return invalid_argument("mtp acceptance = " + std::to_string(d.mtp.acceptance) +
                            ", expected a probability in [0, 1]");
  }
  if (d.precision.dispatch_scale_bytes < 0.0) {
    return invalid_argument("dispatch_scale_bytes must be >= 0");
  }
  return ok_status();
}

Status validate_prefill_deployment(const PrefillDeployment& d, const ModelProfile& model) {
  PS_RETURN_IF_ERROR(validate_placement(d.experts, model));
  if (d.attention_tp < 1 || d.experts.devices % d.attention_tp != 0) {
    return invalid_argument("prefill attention_tp = " + std::to_string(d.attention_tp) +
                            ", expected a divisor of the " + std::to_string(d.experts.devices) +
                            " devices of the instance");
  }
  if (d.attention_tp > model.num_heads) {
    return invalid_argument("prefill attention_tp = " + std::to_string(d.attention_tp) +
                            " exceeds the " + std::to_string(model.num_heads) + " attention heads");
  }
  if (!(d.max_tokens_per_device >= 1.0) || !(d.max_tokens_per_device <= kMaxEstimateTokens)) {
    return invalid_argument("prefill max_tokens_per_device must be in [1, 1e12]");
  }
  return ok_status();
}

}  // namespace peerserve::plan
