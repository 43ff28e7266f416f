// Achieved operator rates on one device and the roofline time of one operator:
// time = max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s).
#pragma once

#include "base/status.h"
#include "plan/analytic/deployment.h"
#include "plan/profiles/hardware_profile.h"

namespace peerserve::plan {

struct DeviceRates {
  double gemm_flops = 0.0;       // FLOP/s: peak at the weight precision x efficiency.gemm
  double attention_flops = 0.0;  // FLOP/s: peak at the attention precision x efficiency.attention
  double memory_bytes = 0.0;     // bytes/s: HBM bandwidth x efficiency.memory
};

// Rates for decode kernels; for prefill every rate is further multiplied by
// efficiency.prefill. NotFound when the hardware has no peak for a requested precision.
Result<DeviceRates> device_rates(const HardwareProfile& hw, const PrecisionPlan& precision,
                                 bool prefill);

// A linear layer with `weights` elements applied to `tokens` tokens, on a `share` of the
// device's compute and bandwidth (0 < share <= 1): 2 * weights * tokens FLOPs against reading
// the weights once.
double gemm_seconds(const DeviceRates& rates, double weights, double tokens,
                    double weight_bytes_per_element, double share = 1.0);

// An attention core with `flops` FLOPs and `bytes` of KV cache read.
double attention_seconds(const DeviceRates& rates, double flops, double bytes, double share = 1.0);

}  // namespace peerserve::plan
