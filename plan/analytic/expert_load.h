// Which experts a rank of an EP group holds and how many tokens it computes per MoE layer.
#pragma once

#include "plan/analytic/deployment.h"
#include "plan/analytic/device_rates.h"
#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

struct ExpertLoad {
  int routed_devices = 0;                  // ranks holding routed experts
  double slots_per_routed_device = 0.0;    // routed expert replicas per such rank
  double experts_per_routed_device = 0.0;  // weight sets held: slots + colocated shared
  // Tokens computed per MoE layer by the busiest routed rank (including its colocated shared
  // expert) and by a dedicated shared-expert rank (0 when shared experts are colocated).
  double routed_device_tokens = 0.0;
  double shared_device_tokens = 0.0;
  double copies_per_token = 0.0;  // dispatch destinations per token
};

// Every rank of the group contributes `tokens_per_device` tokens: the group routes
// tokens_per_device x devices tokens, each to top-k routed slots (spread evenly, scaled by
// expert_imbalance on the busiest rank) and to the shared expert(s).
ExpertLoad expert_load(const ModelProfile& model, const ExpertPlacement& placement,
                       double tokens_per_device);

// Time of the busiest rank's expert FFNs: its tokens through one expert each (SwiGLU,
// 2 x expert_weights FLOPs per token) against reading every expert it holds.
double expert_seconds(const ModelProfile& model, const ExpertLoad& load, const DeviceRates& rates,
                      double weight_bytes_per_element, double share = 1.0);

}  // namespace peerserve::plan
