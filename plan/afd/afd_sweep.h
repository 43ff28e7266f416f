// Sweeps of the AFD model: throughput and idle time over the ratio r (theory, and optionally
// the simulator at integer r), and the optimal ratio r* over B, mu_P or mu_D.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/afd/afd_model.h"
#include "plan/afd/afd_optimal_ratio.h"
#include "plan/afd/afd_simulator.h"

namespace peerserve::plan {

struct AfdRatioSweepPoint {
  AfdOperatingPoint theory;                      // eq. 6 at T̄, with fluid idle fractions
  std::optional<AfdSimulationResult> simulated;  // set when simulation was asked for
};

// `ratios` must be > 0; with `simulation` set, every ratio must be a whole number (the
// simulated bundle is rA–1F) and its attention_instances field is overwritten per point.
Result<std::vector<AfdRatioSweepPoint>> afd_ratio_sweep(
    const AfdLatencyModel& model, const AfdWorkload& workload, const std::vector<double>& ratios,
    const std::optional<AfdSimulationOptions>& simulation);

enum class AfdSweepParameter { kMicrobatch, kMeanPrefill, kMeanDecode };
std::string_view afd_sweep_parameter_name(AfdSweepParameter parameter);
Result<AfdSweepParameter> parse_afd_sweep_parameter(std::string_view name);  // "B", "mu_P", ...

struct AfdOptimumSweepPoint {
  double value = 0.0;  // the swept parameter's value
  AfdOptimalRatio optimum;
};

Result<std::vector<AfdOptimumSweepPoint>> afd_optimum_sweep(const AfdLatencyModel& model,
                                                            const AfdWorkload& workload,
                                                            AfdSweepParameter parameter,
                                                            const std::vector<double>& values);

}  // namespace peerserve::plan
