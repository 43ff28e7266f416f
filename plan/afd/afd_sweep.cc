#include "plan/afd/afd_sweep.h"

#include <cmath>
#include <string>

namespace peerserve::plan {

Result<std::vector<AfdRatioSweepPoint>> afd_ratio_sweep(
    const AfdLatencyModel& model, const AfdWorkload& workload, const std::vector<double>& ratios,
    const std::optional<AfdSimulationOptions>& simulation) {
  std::vector<AfdRatioSweepPoint> points;
  points.reserve(ratios.size());
  for (double ratio : ratios) {
    AfdRatioSweepPoint point;
    PS_ASSIGN_OR_RETURN(point.theory, afd_operating_point(model, workload, ratio));
    if (simulation) {
      if (ratio != std::floor(ratio)) {
        return invalid_argument("AFD sweep: ratio " + std::to_string(ratio) +
                                " cannot be simulated; the simulator needs a whole number of "
                                "Attention instances per FFN instance");
      }
      AfdSimulationOptions options = *simulation;
      options.attention_instances = static_cast<int>(ratio);
      PS_ASSIGN_OR_RETURN(point.simulated, simulate_afd(model, workload, options));
    }
    points.push_back(std::move(point));
  }
  return points;
}

std::string_view afd_sweep_parameter_name(AfdSweepParameter parameter) {
  switch (parameter) {
    case AfdSweepParameter::kMicrobatch:
      return "B";
    case AfdSweepParameter::kMeanPrefill:
      return "mu_P";
    case AfdSweepParameter::kMeanDecode:
      return "mu_D";
  }
  return "unknown";
}

Result<AfdSweepParameter> parse_afd_sweep_parameter(std::string_view name) {
  if (name == "B" || name == "batch" || name == "microbatch") return AfdSweepParameter::kMicrobatch;
  if (name == "mu_P" || name == "mu-prefill" || name == "prefill") {
    return AfdSweepParameter::kMeanPrefill;
  }
  if (name == "mu_D" || name == "mu-decode" || name == "decode") {
    return AfdSweepParameter::kMeanDecode;
  }
  return invalid_argument("AFD sweep parameter '" + std::string(name) +
                          "', expected one of B, mu_P, mu_D");
}

Result<std::vector<AfdOptimumSweepPoint>> afd_optimum_sweep(const AfdLatencyModel& model,
                                                            const AfdWorkload& workload,
                                                            AfdSweepParameter parameter,
                                                            const std::vector<double>& values) {
  std::vector<AfdOptimumSweepPoint> points;
  points.reserve(values.size());
  for (double value : values) {
    AfdWorkload varied = workload;
    switch (parameter) {
      case AfdSweepParameter::kMicrobatch:
        varied.microbatch = value;
        break;
      case AfdSweepParameter::kMeanPrefill:
        varied.mean_prefill = value;
        break;
      case AfdSweepParameter::kMeanDecode:
        varied.mean_decode = value;
        break;
    }
    AfdOptimumSweepPoint point;
    point.value = value;
    PS_ASSIGN_OR_RETURN(point.optimum, afd_optimal_ratio(model, varied));
    points.push_back(point);
  }
  return points;
}

}  // namespace peerserve::plan
