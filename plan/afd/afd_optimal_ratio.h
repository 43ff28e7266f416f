// Closed forms of paper 003 §4: expected and horizon-average Attention token load, the three
// operating regimes of an rA–1F bundle, and the optimal Attention/FFN ratio r* (Theorem 4.4).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "plan/afd/afd_model.h"

namespace peerserve::plan {

// Eq. (11): E[T_k] for one Attention microbatch that starts cold (every slot fresh) at k = 0.
double afd_expected_token_load(const AfdWorkload& workload, int64_t step);

// The horizon-average token load T̄ (Def. 4.2). With workload.requests_per_instance unset this is
// the N -> infinity limit B·(mu_P + (1-p)/p) (eq. 14); with N set it is the exact finite-N
// closed form of App. A.2, B·mu_P + B·m − B·m·(1 − (1−p)^K)/(K·p) with m = (1−p)/p, K = N/(B·p).
double afd_horizon_token_load(const AfdWorkload& workload);

// App. A.2's large-N approximation B·(mu_P + m) − m·B²/N. REQUIRES: requests_per_instance set.
double afd_horizon_token_load_large_n(const AfdWorkload& workload);

enum class AfdRegime {
  kAttentionBound,      // Regime I: t_A >= t_C and t_A >= t_F(r)
  kCommunicationBound,  // Regime II: t_C >= t_A and t_C >= t_F(r)
  kFfnBound,            // Regime III: t_F(r) >= max(t_A, t_C)
};
std::string_view afd_regime_name(AfdRegime regime);

// Everything Theorem 4.4 computes, for one (model, workload).
struct AfdOptimalRatio {
  double token_load = 0.0;       // T̄
  double attention_time = 0.0;   // t̄_A = alpha_A·T̄ + beta_A
  double comm_time = 0.0;        // t̄_C = alpha_C·B + beta_C
  double ratio_attention = 0.0;  // r_A (eq. 15): t_F(r_A) = t̄_A; may be negative
  double ratio_comm = 0.0;       // r_C (eq. 16): t_F(r_C) = t̄_C; may be negative
  double ratio_peak = 0.0;       // r_peak = sqrt(beta_F/(alpha_F·B)) (eq. 18)
  double ratio = 0.0;            // r* = max(r_A, r_C, r_peak) (eq. 19)
  AfdRegime binding = AfdRegime::kAttentionBound;  // which term of eq. 19 is the maximum
  double throughput = 0.0;  // eq. 20: tokens per unit time per instance at r*
};

Result<AfdOptimalRatio> afd_optimal_ratio(const AfdLatencyModel& model,
                                          const AfdWorkload& workload);

// The bundle at a given ratio r (> 0), evaluated at the horizon-average load T̄.
struct AfdOperatingPoint {
  double ratio = 0.0;
  double cycle_time = 0.0;  // tau = max(t̄_A, t̄_C, t̄_F(r)) (eq. 5)
  double throughput = 0.0;  // eq. 6: (1/(r+1))·rB/tau
  AfdRegime regime = AfdRegime::kAttentionBound;
  // Fluid idle fractions 1 − t/tau of an Attention and of the FFN instance. Not the paper's
  // definition (eq. 23 is measured in simulation) but its limit when nothing fluctuates.
  double attention_idle = 0.0;
  double ffn_idle = 0.0;
};

Result<AfdOperatingPoint> afd_operating_point(const AfdLatencyModel& model,
                                              const AfdWorkload& workload, double ratio);

// r* realised as an integer bundle x Attention : y FFN instances (x, y >= 1, y <= max_ffn):
// the candidate x/y with the highest eq.-6 throughput. The paper gives no rounding rule; this
// searches, for every y, the two integers x around y·r*.
struct AfdBundle {
  int attention_instances = 0;
  int ffn_instances = 0;
  double throughput = 0.0;
};
Result<AfdBundle> afd_best_bundle(const AfdLatencyModel& model, const AfdWorkload& workload,
                                  int max_ffn_instances);

}  // namespace peerserve::plan
