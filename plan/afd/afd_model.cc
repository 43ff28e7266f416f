#include "plan/afd/afd_model.h"

#include <cmath>
#include <string>

namespace peerserve::plan {
namespace {

Status check_coefficient(const char* name, double value, bool must_be_positive) {
  if (!std::isfinite(value) || value < 0.0 || (must_be_positive && value == 0.0)) {
    return invalid_argument(std::string("AFD latency model: ") + name + " = " +
                            std::to_string(value) + ", expected a finite value " +
                            (must_be_positive ? "> 0" : ">= 0"));
  }
  return ok_status();
}

}  // namespace

Status AfdLatencyModel::validate() const {
  PS_RETURN_IF_ERROR(check_coefficient("alpha_attention", alpha_attention, false));
  PS_RETURN_IF_ERROR(check_coefficient("beta_attention", beta_attention, false));
  PS_RETURN_IF_ERROR(check_coefficient("alpha_ffn", alpha_ffn, true));
  PS_RETURN_IF_ERROR(check_coefficient("beta_ffn", beta_ffn, true));
  PS_RETURN_IF_ERROR(check_coefficient("alpha_comm", alpha_comm, false));
  PS_RETURN_IF_ERROR(check_coefficient("beta_comm", beta_comm, false));
  return ok_status();
}

AfdLatencyModel paper003_latency_model() {
  return AfdLatencyModel{.alpha_attention = 0.00165,
                         .beta_attention = 50.0,
                         .alpha_ffn = 0.083,
                         .beta_ffn = 100.0,
                         .alpha_comm = 0.022,
                         .beta_comm = 20.0};
}

double AfdWorkload::termination_probability() const {
  return convention == DecodeLengthConvention::kStepsFromOne ? 1.0 / mean_decode
                                                             : 1.0 / (mean_decode + 1.0);
}

double AfdWorkload::saturated_decode_load() const {
  const double p = termination_probability();
  return (1.0 - p) / p;
}

Status AfdWorkload::validate() const {
  if (!std::isfinite(microbatch) || microbatch <= 0.0) {
    return invalid_argument("AFD workload: microbatch B = " + std::to_string(microbatch) +
                            ", expected a finite value > 0");
  }
  if (!std::isfinite(mean_prefill) || mean_prefill < 0.0) {
    return invalid_argument("AFD workload: mean prefill length mu_P = " +
                            std::to_string(mean_prefill) + ", expected a finite value >= 0");
  }
  const double min_decode = convention == DecodeLengthConvention::kStepsFromOne ? 1.0 : 0.0;
  if (!std::isfinite(mean_decode) || mean_decode < min_decode ||
      (convention == DecodeLengthConvention::kPaperDefinition && mean_decode <= 0.0)) {
    return invalid_argument(
        "AFD workload: mean decode length mu_D = " + std::to_string(mean_decode) +
        (convention == DecodeLengthConvention::kStepsFromOne
             ? ", expected >= 1 (every request takes at least one step)"
             : ", expected > 0"));
  }
  if (requests_per_instance &&
      (!std::isfinite(*requests_per_instance) || *requests_per_instance <= 0.0)) {
    return invalid_argument("AFD workload: requests per Attention instance N = " +
                            std::to_string(*requests_per_instance) +
                            ", expected a finite value > 0 (or unset for N -> infinity)");
  }
  return ok_status();
}

AfdWorkload paper003_baseline_workload() {
  AfdWorkload workload;
  workload.microbatch = 256;
  workload.mean_prefill = 100;
  workload.mean_decode = 500;
  workload.requests_per_instance = 10000;
  workload.convention = DecodeLengthConvention::kStepsFromOne;
  return workload;
}

}  // namespace peerserve::plan
