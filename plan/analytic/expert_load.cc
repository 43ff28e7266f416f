#include "plan/analytic/expert_load.h"

#include <algorithm>

namespace peerserve::plan {

ExpertLoad expert_load(const ModelProfile& model, const ExpertPlacement& placement,
                       double tokens_per_device) {
  ExpertLoad load;
  const bool dedicated_shared = placement.shared_expert_devices > 0;
  load.routed_devices = placement.devices - placement.shared_expert_devices;
  const double slots = model.num_routed_experts + placement.redundant_experts;
  load.slots_per_routed_device = slots / load.routed_devices;
  const double group_tokens = tokens_per_device * placement.devices;
  const double tokens_per_slot = group_tokens * model.experts_per_token / slots;
  load.routed_device_tokens =
      load.slots_per_routed_device * tokens_per_slot * placement.expert_imbalance;
  load.experts_per_routed_device = load.slots_per_routed_device;
  if (dedicated_shared) {
    load.shared_device_tokens =
        group_tokens * model.num_shared_experts / placement.shared_expert_devices;
    load.copies_per_token = model.experts_per_token + model.num_shared_experts;
  } else {
    load.routed_device_tokens += tokens_per_device * model.num_shared_experts;
    load.experts_per_routed_device += model.num_shared_experts;
    load.copies_per_token = model.experts_per_token;
  }
  return load;
}

double expert_seconds(const ModelProfile& model, const ExpertLoad& load, const DeviceRates& rates,
                      double weight_bytes_per_element, double share) {
  const double w = expert_weights(model);
  auto device_time = [&](double tokens, double experts_held) {
    if (tokens <= 0.0) return 0.0;
    const double compute = 2.0 * w * tokens / (rates.gemm_flops * share);
    const double memory =
        w * experts_held * weight_bytes_per_element / (rates.memory_bytes * share);
    return std::max(compute, memory);
  };
  const double routed = device_time(load.routed_device_tokens, load.experts_per_routed_device);
  const double shared = device_time(load.shared_device_tokens, model.num_shared_experts);
  return std::max(routed, shared);
}

}  // namespace peerserve::plan
