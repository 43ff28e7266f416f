// Sweeps over r, B, mu_P and mu_D, and the reproduction rows built from them.
#include "plan/afd/afd_sweep.h"

#include <gtest/gtest.h>

#include <cmath>

#include "plan/afd/afd_reproduction.h"

namespace peerserve::plan {
namespace {

double printed(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

TEST(AfdOptimumSweep, WorkloadAblationsOfFigure7) {
  const auto model = paper003_latency_model();
  const auto base = paper003_baseline_workload();
  auto over_decode = afd_optimum_sweep(model, base, AfdSweepParameter::kMeanDecode, {100, 500});
  ASSERT_TRUE(over_decode.ok());
  EXPECT_DOUBLE_EQ(printed((*over_decode)[0].optimum.ratio, 2), 2.17);
  EXPECT_DOUBLE_EQ(printed((*over_decode)[1].optimum.ratio, 2), 9.30);
  auto over_prefill = afd_optimum_sweep(model, base, AfdSweepParameter::kMeanPrefill, {100, 500});
  ASSERT_TRUE(over_prefill.ok());
  EXPECT_DOUBLE_EQ(printed((*over_prefill)[1].optimum.ratio, 2), 17.25);
  // Longer context lowers the peak throughput (§5.4 finding 2).
  EXPECT_GT((*over_prefill)[0].optimum.throughput, (*over_prefill)[1].optimum.throughput);
  auto over_batch = afd_optimum_sweep(model, base, AfdSweepParameter::kMicrobatch, {128, 256, 512});
  ASSERT_TRUE(over_batch.ok());
  // r* and the peak throughput both grow with B (§5.4).
  EXPECT_LT((*over_batch)[0].optimum.ratio, (*over_batch)[1].optimum.ratio);
  EXPECT_LT((*over_batch)[1].optimum.ratio, (*over_batch)[2].optimum.ratio);
  EXPECT_LT((*over_batch)[0].optimum.throughput, (*over_batch)[2].optimum.throughput);
  EXPECT_FALSE(afd_optimum_sweep(model, base, AfdSweepParameter::kMicrobatch, {-1}).ok());
}

TEST(AfdOptimumSweep, ParsesParameterNames) {
  EXPECT_EQ(*parse_afd_sweep_parameter("B"), AfdSweepParameter::kMicrobatch);
  EXPECT_EQ(*parse_afd_sweep_parameter("mu_P"), AfdSweepParameter::kMeanPrefill);
  EXPECT_EQ(*parse_afd_sweep_parameter("mu-decode"), AfdSweepParameter::kMeanDecode);
  auto bad = parse_afd_sweep_parameter("gamma");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected one of"), std::string::npos);
}

TEST(AfdRatioSweep, TheoryAndSimulationSideBySide) {
  AfdWorkload w = paper003_baseline_workload();
  // N/2 = 1,500 requests per microbatch: long enough for the KV load to grow past the warm-up.
  w.requests_per_instance = 3000;
  AfdSimulationOptions options;
  auto sweep = afd_ratio_sweep(paper003_latency_model(), w, {1, 4, 16}, options);
  ASSERT_TRUE(sweep.ok());
  ASSERT_EQ(sweep->size(), 3u);
  for (const auto& point : *sweep) {
    ASSERT_TRUE(point.simulated.has_value());
    EXPECT_EQ(point.simulated->attention_instances, static_cast<int>(point.theory.ratio));
  }
  // Paper §5.3: FFN idles most at r = 1, Attention idles most at large r.
  EXPECT_GT((*sweep)[0].simulated->ffn_idle, 0.5);
  EXPECT_GT((*sweep)[2].simulated->attention_idle, (*sweep)[0].simulated->attention_idle);

  auto fractional = afd_ratio_sweep(paper003_latency_model(), w, {2.5}, options);
  ASSERT_FALSE(fractional.ok());
  EXPECT_NE(fractional.status().message().find("whole number"), std::string::npos);
  EXPECT_TRUE(afd_ratio_sweep(paper003_latency_model(), w, {2.5}, std::nullopt).ok());
}

TEST(AfdReproduction, AnNBeyondTheSimulatorsLimitsIsAnError) {
  // `plan afd --reproduce --requests-per-instance 1e12` aborted on a check here.
  const Result<AfdReproduction> computed =
      afd_reproduction({.simulated_requests_per_instance = 1e12});
  ASSERT_FALSE(computed.ok());
  EXPECT_EQ(computed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(computed.status().message().find("N = 1e+12"), std::string::npos)
      << computed.status().to_string();
}

TEST(AfdReproduction, RowsCarryThePrintedValuesAndTheirInconsistencies) {
  // A shorter simulated horizon keeps the test fast; the closed-form rows do not depend on it.
  const Result<AfdReproduction> computed =
      afd_reproduction({.simulated_requests_per_instance = 1000});
  ASSERT_TRUE(computed.ok()) << computed.status().to_string();
  const AfdReproduction& reproduction = *computed;
  ASSERT_GE(reproduction.rows.size(), 7u);
  int closed_form_rows = 0;
  for (const auto& row : reproduction.rows) {
    EXPECT_FALSE(row.source.empty());
    EXPECT_FALSE(row.quantity.empty());
    if (row.quantity.rfind("optimal A/F ratio", 0) != 0) continue;
    ++closed_form_rows;
    // Self-consistent printed values are met at their printed precision; the batch ablation
    // is flagged as inconsistent and must stay within 1%.
    if (row.note.find("[INCONSISTENT]") != std::string::npos) {
      EXPECT_LT(std::fabs(row.relative_error()), 0.01) << row.quantity;
    } else {
      const int decimals = row.published == 9.3 ? 1 : 2;
      EXPECT_DOUBLE_EQ(printed(row.predicted, decimals), row.published) << row.quantity;
    }
  }
  EXPECT_EQ(closed_form_rows, 7);
  // The chartable sweep covers the paper's grid with simulation results.
  for (int r : {1, 2, 4, 8, 16, 24, 32}) {
    bool found = false;
    for (const auto& point : reproduction.ratio_sweep) {
      if (point.theory.ratio == r && point.simulated) found = true;
    }
    EXPECT_TRUE(found) << r;
  }
}

}  // namespace
}  // namespace peerserve::plan
