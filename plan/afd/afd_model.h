// The Attention/FFN disaggregation (AFD) model of paper 003: linear latency models for the
// Attention, FFN and communication stages of an rA–1F bundle, and the decode workload that
// drives the Attention-side token load.
#pragma once

#include <cstdint>
#include <optional>

#include "base/status.h"

namespace peerserve::plan {

// Eq. (2)–(4): t_A(T) = alpha_A·T + beta_A, t_F(rB) = alpha_F·rB + beta_F,
// t_C(B) = alpha_C·B + beta_C. The unit of time is whatever the coefficients were fitted in
// (the paper's "cycles").
struct AfdLatencyModel {
  double alpha_attention = 0.0;  // time per KV token of one Attention microbatch
  double beta_attention = 0.0;   // fixed Attention time per step
  double alpha_ffn = 0.0;        // time per request of the aggregated FFN batch (rB)
  double beta_ffn = 0.0;         // fixed FFN time per step
  double alpha_comm = 0.0;       // round-trip A<->F time per request of one microbatch
  double beta_comm = 0.0;        // fixed round-trip time

  double attention_time(double token_load) const {
    return alpha_attention * token_load + beta_attention;
  }
  double ffn_time(double aggregated_batch) const { return alpha_ffn * aggregated_batch + beta_ffn; }
  double comm_time(double microbatch) const { return alpha_comm * microbatch + beta_comm; }

  // Slopes must be finite and >= 0, intercepts finite and >= 0, and alpha_ffn and beta_ffn > 0
  // (both appear as divisors in the optimal ratio).
  Status validate() const;
};

// Table 2 (= Table 4) of paper 003: DeepSeek-V3 on Ascend 910C, fitted by regression, in cycles.
AfdLatencyModel paper003_latency_model();

// How the mean decode length mu_D maps to the per-step termination probability p.
enum class DecodeLengthConvention {
  // A request takes S >= 1 decode steps, one output token each, S ~ Geometric(p) on {1, 2, ...}
  // with E[S] = mu_D, so p = 1/mu_D and the decode index saturates at (1-p)/p = mu_D - 1.
  // This is the reading under which the paper's printed 9.30 and 17.25 come out exactly.
  kStepsFromOne,
  // The paper's written definition: D ~ Geometric(p) on {0, 1, ...} with mu_D = (1-p)/p,
  // so p = 1/(mu_D + 1).
  kPaperDefinition,
};

// The decode workload of one Attention instance (Section 3.3).
struct AfdWorkload {
  double microbatch = 256;    // B: requests per Attention microbatch (real-valued in the theory)
  double mean_prefill = 100;  // mu_P: mean prompt length (KV tokens a request arrives with)
  double mean_decode = 500;   // mu_D: mean decode length
  // N: requests served by one Attention instance over the horizon. Unset = the N -> infinity
  // limit of Proposition 4.3 (the paper's recipe); set = the exact finite-N average of App. A.2.
  std::optional<double> requests_per_instance;
  DecodeLengthConvention convention = DecodeLengthConvention::kStepsFromOne;

  double termination_probability() const;  // p
  double saturated_decode_load() const;    // (1 - p)/p: mean decode index in steady state

  Status validate() const;
};

// Baseline of paper 003 §5.3: B = 256, mu_P = 100, mu_D = 500, N = 10,000 per instance.
AfdWorkload paper003_baseline_workload();

}  // namespace peerserve::plan
