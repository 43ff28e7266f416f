#include "plan/afd/afd_reproduction.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "base/check.h"

namespace peerserve::plan {
namespace {

constexpr char kSection53[] = "paper003 §5.3";
constexpr char kFigure6[] = "paper003 §5.4 Fig. 6";
constexpr char kFigure7[] = "paper003 §5.4 Fig. 7";

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

double optimal_ratio(AfdWorkload workload) {
  Result<AfdOptimalRatio> optimum = afd_optimal_ratio(paper003_latency_model(), workload);
  PS_CHECK(optimum.ok()) << optimum.status().to_string();
  return optimum->ratio;
}

AfdWorkload with(double microbatch, double mean_prefill, double mean_decode) {
  AfdWorkload workload = paper003_baseline_workload();
  workload.microbatch = microbatch;
  workload.mean_prefill = mean_prefill;
  workload.mean_decode = mean_decode;
  return workload;
}

// r* under the paper's own recipe (N -> infinity, p = 1/(mu_D + 1)), quoted in the notes.
double recipe_ratio(double microbatch, double mean_prefill, double mean_decode) {
  AfdWorkload workload = with(microbatch, mean_prefill, mean_decode);
  workload.requests_per_instance.reset();
  workload.convention = DecodeLengthConvention::kPaperDefinition;
  return optimal_ratio(workload);
}

ReproductionRow ratio_row(const char* source, std::string quantity, double published,
                          double microbatch, double mean_prefill, double mean_decode,
                          std::string note) {
  ReproductionRow row;
  row.source = source;
  row.quantity = std::move(quantity);
  row.published = published;
  row.predicted = optimal_ratio(with(microbatch, mean_prefill, mean_decode));
  row.note = "finite-N form, N=10,000, p=1/mu_D; paper's N->infinity recipe gives " +
             fixed(recipe_ratio(microbatch, mean_prefill, mean_decode), 2) + ". " + note;
  return row;
}

const AfdSimulationResult& simulated_at(const std::vector<AfdRatioSweepPoint>& sweep, int r) {
  for (const auto& point : sweep) {
    if (point.theory.ratio == r) return *point.simulated;
  }
  PS_CHECK(false) << "ratio " << r << " not in the reproduction sweep";
  return *sweep.front().simulated;
}

}  // namespace

Result<AfdReproduction> afd_reproduction(const AfdReproductionOptions& options) {
  AfdReproduction out;
  const char* batch_note =
      "[INCONSISTENT] the batch ablation fits no single N: solving eq. 19 for N gives about "
      "10.5k (B=128), 11.8k (B=256), 12.1k (B=512) with p=1/mu_D; reported, not fitted.";
  out.rows.push_back(ratio_row(kSection53, "optimal A/F ratio r*, baseline B=256 mu_P=100 mu_D=500",
                               9.3, 256, 100, 500, "Printed as '≈9.3'."));
  out.rows.push_back(
      ratio_row(kFigure6, "optimal A/F ratio r*, B=128", 7.08, 128, 100, 500, batch_note));
  out.rows.push_back(ratio_row(
      kFigure6, "optimal A/F ratio r*, B=256", 9.34, 256, 100, 500,
      std::string(batch_note) +
          " The same configuration is printed as 9.30 in the workload ablation and ≈9.3 in §5.3."));
  out.rows.push_back(
      ratio_row(kFigure6, "optimal A/F ratio r*, B=512", 10.31, 512, 100, 500, batch_note));
  out.rows.push_back(ratio_row(kFigure7, "optimal A/F ratio r*, mu_P=100 mu_D=100", 2.17, 256, 100,
                               100,
                               "r_peak = sqrt(beta_F/(alpha_F·B)) binds (FFN-bound regime), so "
                               "N and the p convention do not matter."));
  out.rows.push_back(ratio_row(kFigure7, "optimal A/F ratio r*, mu_P=100 mu_D=500", 9.30, 256, 100,
                               500, "Both ablations start from this point."));
  out.rows.push_back(
      ratio_row(kFigure7, "optimal A/F ratio r*, mu_P=500 mu_D=500", 17.25, 256, 500, 500, ""));

  // The simulator with the paper's semantics at the baseline.
  std::vector<double> ratios;
  for (int r = 1; r <= 12; ++r) ratios.push_back(r);
  for (int r : {16, 20, 24, 28, 32}) ratios.push_back(r);
  AfdSimulationOptions simulation;
  simulation.seed = 1;
  AfdWorkload simulated = paper003_baseline_workload();
  simulated.requests_per_instance = options.simulated_requests_per_instance;
  Result<std::vector<AfdRatioSweepPoint>> sweep =
      afd_ratio_sweep(paper003_latency_model(), simulated, ratios, simulation);
  if (!sweep.ok()) {
    char n[32];
    std::snprintf(n, sizeof(n), "%g", options.simulated_requests_per_instance);
    return sweep.status().with_context(
        std::string("the reproduction's sweep (r = 1..32, mu_D = 500) at N = ") + n);
  }
  out.ratio_sweep = std::move(sweep).value();
  const auto& points = out.ratio_sweep;

  const char* sim_note =
      "peerserve's simulator: paper's semantics (2 batches in flight, barrier, refill), uniform "
      "prefill on [0, 2·mu_P], t_C split half each way, seed 1";
  {
    ReproductionRow row;
    row.source = "paper003 §5.3 Fig. 5";
    row.quantity = "FFN idle ratio eta_F at r=1";
    row.published = 0.60;
    row.predicted = simulated_at(points, 1).ffn_idle;
    row.note = std::string("Printed as a bound, '>60%'. ") + sim_note +
               ". The fluid limit 1 - t_F/t_A is " + fixed(points.front().theory.ffn_idle, 3) +
               "; the simulator's horizon holds N/2 requests per microbatch, so its t_A is lower.";
    out.rows.push_back(row);
  }
  {
    ReproductionRow row;
    row.source = "paper003 §5.3 Fig. 5";
    row.quantity = "Attention idle ratio eta_A at r=32";
    row.published = 0.60;
    row.predicted = simulated_at(points, 32).attention_idle;
    row.note = std::string("Printed as a bound, '>60%'. ") + sim_note + ".";
    out.rows.push_back(row);
  }
  {
    // Where eta_A − eta_F changes sign, interpolated linearly between integer ratios.
    double crossover = 0.0;
    for (size_t i = 1; i < points.size() && crossover == 0.0; ++i) {
      const double before =
          points[i - 1].simulated->attention_idle - points[i - 1].simulated->ffn_idle;
      const double after = points[i].simulated->attention_idle - points[i].simulated->ffn_idle;
      if (before < 0.0 && after >= 0.0) {
        const double r0 = points[i - 1].theory.ratio;
        const double r1 = points[i].theory.ratio;
        crossover = r0 + (r1 - r0) * (-before) / (after - before);
      }
    }
    ReproductionRow row;
    row.source = "paper003 §5.3 Fig. 5";
    row.quantity = "A/F ratio where eta_A = eta_F (simulation)";
    row.published = 8.0;
    row.predicted = crossover;
    row.note = std::string("Printed as 'around r=8'. ") + sim_note + ".";
    out.rows.push_back(row);
  }
  {
    // Eq. 21 optimum over the simulated integer ratios vs the theory r*.
    const AfdRatioSweepPoint* best = &points.front();
    for (const auto& point : points) {
      if (point.simulated->throughput_per_instance > best->simulated->throughput_per_instance) {
        best = &point;
      }
    }
    // On the paper's grid as well.
    const AfdRatioSweepPoint* best_on_grid = nullptr;
    for (const auto& point : points) {
      const double r = point.theory.ratio;
      const bool on_grid = r == 1 || r == 2 || r == 4 || r == 8 || r == 16 || r == 24 || r == 32;
      if (on_grid &&
          (best_on_grid == nullptr || point.simulated->throughput_per_instance >
                                          best_on_grid->simulated->throughput_per_instance)) {
        best_on_grid = &point;
      }
    }
    // The theory at the simulated N, so the two sides compare one workload.
    const double theory = optimal_ratio(simulated);
    ReproductionRow row;
    row.source = kSection53;
    row.quantity = "relative gap between theory r* and the simulation-optimal r (%)";
    row.published = 10.0;
    row.predicted = 100.0 * std::fabs(theory - best->theory.ratio) / best->theory.ratio;
    row.note =
        "Printed as a bound, 'within 10%'. Simulated optimum (eq. 21, whole-number r) is r=" +
        fixed(best->theory.ratio, 0) + " vs theory " + fixed(theory, 2) +
        "; on the paper's grid {1,2,4,8,16,24,32} it is " +
        fixed(best_on_grid ? best_on_grid->theory.ratio : 0.0, 0) +
        ". Near r* two batches "
        "in flight cannot hide t_C (period max(2t_A, 2t_F, t_A+t_F+t_C)) and the barrier "
        "waits for the slowest instance, which pulls the simulated optimum below r*. " +
        sim_note + ".";
    out.rows.push_back(row);
  }
  {
    const AfdRatioSweepPoint& last = points.back();
    ReproductionRow row;
    row.source = kSection53;
    row.quantity = "simulated throughput below theory at r=32 (%)";
    row.published = 15.0;
    row.predicted =
        100.0 * (1.0 - last.simulated->throughput_per_instance / last.theory.throughput);
    row.note =
        "Eq. 21 metric, which counts only finished requests' tokens. At r=32 the FFN is the "
        "bottleneck (t_F=780 vs t_A≈300), so stragglers cannot slow it; the token rate equals "
        "theory (" +
        fixed(last.simulated->token_rate_per_instance, 4) + " vs " +
        fixed(last.theory.throughput, 4) +
        ") and the paper's stated semantics do not explain a 15% gap. " + sim_note + ".";
    out.rows.push_back(row);
  }
  return out;
}

std::vector<ReproductionRow> afd_reproduction_rows() {
  Result<AfdReproduction> reproduction = afd_reproduction();
  PS_CHECK(reproduction.ok()) << reproduction.status().to_string();  // the paper's own N
  return std::move(reproduction).value().rows;
}

}  // namespace peerserve::plan
