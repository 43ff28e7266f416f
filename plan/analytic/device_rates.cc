#include "plan/analytic/device_rates.h"

#include <algorithm>

namespace peerserve::plan {

Result<DeviceRates> device_rates(const HardwareProfile& hw, const PrecisionPlan& precision,
                                 bool prefill) {
  PS_ASSIGN_OR_RETURN(const double gemm_peak, hw.peak_flops(precision.weights));
  PS_ASSIGN_OR_RETURN(const double attention_peak, hw.peak_flops(precision.attention));
  const double phase = prefill ? hw.efficiency.prefill : 1.0;
  DeviceRates rates;
  rates.gemm_flops = gemm_peak * hw.efficiency.gemm * phase;
  rates.attention_flops = attention_peak * hw.efficiency.attention * phase;
  rates.memory_bytes = hw.hbm_bandwidth_gb_s * 1e9 * hw.efficiency.memory * phase;
  return rates;
}

double gemm_seconds(const DeviceRates& rates, double weights, double tokens,
                    double weight_bytes_per_element, double share) {
  if (weights <= 0.0 || tokens <= 0.0) return 0.0;
  const double compute = 2.0 * weights * tokens / (rates.gemm_flops * share);
  const double memory = weights * weight_bytes_per_element / (rates.memory_bytes * share);
  return std::max(compute, memory);
}

double attention_seconds(const DeviceRates& rates, double flops, double bytes, double share) {
  if (flops <= 0.0 && bytes <= 0.0) return 0.0;
  return std::max(flops / (rates.attention_flops * share), bytes / (rates.memory_bytes * share));
}

}  // namespace peerserve::plan
