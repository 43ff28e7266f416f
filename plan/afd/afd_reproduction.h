// Paper 003's printed numbers next to peerserve's closed forms and simulator, for the
// reproduction report, and the A/F ratio sweep (throughput and idle time) that it charts.
#pragma once

#include <vector>

#include "base/status.h"
#include "plan/afd/afd_sweep.h"
#include "plan/report/reproduction_row.h"

namespace peerserve::plan {

struct AfdReproduction {
  std::vector<ReproductionRow> rows;
  // Baseline (B = 256, mu_P = 100, mu_D = 500, N = 10,000): theory and simulation (seed 1) at
  // r = 1..12, 16, 20, 24, 28, 32, including the paper's grid {1, 2, 4, 8, 16, 24, 32}.
  std::vector<AfdRatioSweepPoint> ratio_sweep;
};

struct AfdReproductionOptions {
  // N for the simulated rows and the sweep; the paper's is 10,000. Smaller is faster and
  // noisier; the closed-form rows do not depend on it.
  double simulated_requests_per_instance = 10000;
};

// Conventions behind every predicted value: Table 2 coefficients, the finite-N horizon
// average with N = 10,000 per Attention instance and p = 1/mu_D (DecodeLengthConvention::
// kStepsFromOne), the only reading under which the printed 9.30 and 17.25 come out exactly.
// Deterministic; runs the simulator (a fraction of a second at the paper's N). An N whose
// sweep (r up to 32, mu_D = 500) is beyond the simulator's limits is an InvalidArgument.
Result<AfdReproduction> afd_reproduction(const AfdReproductionOptions& options = {});

// afd_reproduction().rows with the paper's N.
std::vector<ReproductionRow> afd_reproduction_rows();

}  // namespace peerserve::plan
