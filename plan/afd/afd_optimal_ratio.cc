#include "plan/afd/afd_optimal_ratio.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace peerserve::plan {

double afd_expected_token_load(const AfdWorkload& workload, int64_t step) {
  const double p = workload.termination_probability();
  const double b = workload.microbatch;
  return b * workload.mean_prefill + b * workload.saturated_decode_load() *
                                         (1.0 - std::pow(1.0 - p, static_cast<double>(step)));
}

double afd_horizon_token_load(const AfdWorkload& workload) {
  const double b = workload.microbatch;
  const double m = workload.saturated_decode_load();
  const double asymptotic = b * (workload.mean_prefill + m);
  if (!workload.requests_per_instance) return asymptotic;
  const double p = workload.termination_probability();
  if (p >= 1.0) return asymptotic;  // every request lasts one step: no decode load at all
  const double steps = *workload.requests_per_instance / (b * p);  // K(B), eq. 12
  // (1 − (1−p)^K)/(K·p), written with expm1/log1p so that small p keeps its precision.
  const double decayed = -std::expm1(steps * std::log1p(-p));
  return asymptotic - b * m * decayed / (steps * p);
}

double afd_horizon_token_load_large_n(const AfdWorkload& workload) {
  PS_CHECK(workload.requests_per_instance.has_value()) << "large-N form needs N";
  const double b = workload.microbatch;
  const double m = workload.saturated_decode_load();
  return b * (workload.mean_prefill + m) - m * b * b / *workload.requests_per_instance;
}

std::string_view afd_regime_name(AfdRegime regime) {
  switch (regime) {
    case AfdRegime::kAttentionBound:
      return "attention-bound";
    case AfdRegime::kCommunicationBound:
      return "communication-bound";
    case AfdRegime::kFfnBound:
      return "ffn-bound";
  }
  return "unknown";
}

Result<AfdOptimalRatio> afd_optimal_ratio(const AfdLatencyModel& model,
                                          const AfdWorkload& workload) {
  PS_RETURN_IF_ERROR(model.validate());
  PS_RETURN_IF_ERROR(workload.validate());
  const double b = workload.microbatch;
  AfdOptimalRatio out;
  out.token_load = afd_horizon_token_load(workload);
  out.attention_time = model.attention_time(out.token_load);
  out.comm_time = model.comm_time(b);
  out.ratio_attention = (out.attention_time - model.beta_ffn) / (model.alpha_ffn * b);
  out.ratio_comm = (out.comm_time - model.beta_ffn) / (model.alpha_ffn * b);
  out.ratio_peak = std::sqrt(model.beta_ffn / (model.alpha_ffn * b));
  out.ratio = out.ratio_attention;
  out.binding = AfdRegime::kAttentionBound;
  if (out.ratio_comm > out.ratio) {
    out.ratio = out.ratio_comm;
    out.binding = AfdRegime::kCommunicationBound;
  }
  if (out.ratio_peak > out.ratio) {
    out.ratio = out.ratio_peak;
    out.binding = AfdRegime::kFfnBound;
  }
  const double r = out.ratio;
  out.throughput = r * b / ((r + 1.0) * (model.alpha_ffn * r * b + model.beta_ffn));
  return out;
}

Result<AfdOperatingPoint> afd_operating_point(const AfdLatencyModel& model,
                                              const AfdWorkload& workload, double ratio) {
  PS_RETURN_IF_ERROR(model.validate());
  PS_RETURN_IF_ERROR(workload.validate());
  if (!std::isfinite(ratio) || ratio <= 0.0) {
    return invalid_argument("AFD ratio r = " + std::to_string(ratio) +
                            ", expected a finite value > 0 (Attention instances per FFN)");
  }
  const double b = workload.microbatch;
  const double t_a = model.attention_time(afd_horizon_token_load(workload));
  const double t_c = model.comm_time(b);
  const double t_f = model.ffn_time(ratio * b);
  AfdOperatingPoint out;
  out.ratio = ratio;
  out.cycle_time = std::max({t_a, t_c, t_f});
  out.throughput = ratio * b / ((ratio + 1.0) * out.cycle_time);
  // Ties go to the lower-numbered regime, as in the paper's >= conditions.
  if (t_a >= t_c && t_a >= t_f) {
    out.regime = AfdRegime::kAttentionBound;
  } else if (t_c >= t_f) {
    out.regime = AfdRegime::kCommunicationBound;
  } else {
    out.regime = AfdRegime::kFfnBound;
  }
  out.attention_idle = 1.0 - t_a / out.cycle_time;
  out.ffn_idle = 1.0 - t_f / out.cycle_time;
  return out;
}

Result<AfdBundle> afd_best_bundle(const AfdLatencyModel& model, const AfdWorkload& workload,
                                  int max_ffn_instances) {
  if (max_ffn_instances < 1) {
    return invalid_argument("AFD bundle: max FFN instances = " + std::to_string(max_ffn_instances) +
                            ", expected >= 1");
  }
  PS_ASSIGN_OR_RETURN(AfdOptimalRatio optimum, afd_optimal_ratio(model, workload));
  if (optimum.ratio * max_ffn_instances > 1e7) {
    return invalid_argument("AFD bundle: r* = " + std::to_string(optimum.ratio) + " with up to " +
                            std::to_string(max_ffn_instances) +
                            " FFN instances needs more than 1e7 Attention instances");
  }
  AfdBundle best;
  for (int y = 1; y <= max_ffn_instances; ++y) {
    const double ideal = optimum.ratio * y;
    for (double x : {std::floor(ideal), std::ceil(ideal)}) {
      if (x < 1.0) x = 1.0;
      PS_ASSIGN_OR_RETURN(AfdOperatingPoint point, afd_operating_point(model, workload, x / y));
      // Strictly better only, so the smallest bundle wins a tie (e.g. 9A-1F over 18A-2F).
      if (point.throughput > best.throughput * (1.0 + 1e-12)) {
        best = AfdBundle{static_cast<int>(x), y, point.throughput};
      }
    }
  }
  return best;
}

}  // namespace peerserve::plan
