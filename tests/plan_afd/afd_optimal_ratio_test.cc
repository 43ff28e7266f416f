// Closed forms of paper 003 against the paper's printed values and against plain sums.
#include "plan/afd/afd_optimal_ratio.h"

#include <gtest/gtest.h>

#include <cmath>

namespace peerserve::plan {
namespace {

AfdWorkload workload(double b, double mu_p, double mu_d) {
  AfdWorkload w = paper003_baseline_workload();
  w.microbatch = b;
  w.mean_prefill = mu_p;
  w.mean_decode = mu_d;
  return w;
}

double ratio(const AfdWorkload& w) {
  auto optimum = afd_optimal_ratio(paper003_latency_model(), w);
  EXPECT_TRUE(optimum.ok()) << optimum.status().to_string();
  return optimum.ok() ? optimum->ratio : 0.0;
}

// Rounds to the printed number of decimals, as a reader of the paper would compare.
double printed(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

TEST(AfdOptimalRatio, MatchesPrintedValuesWhereThePaperIsSelfConsistent) {
  // §5.3 "≈ 9.3"; §5.4 "from 2.17 to 9.30" (mu_D 100 -> 500) and "from 9.30 to 17.25" (mu_P).
  EXPECT_DOUBLE_EQ(printed(ratio(workload(256, 100, 500)), 1), 9.3);
  EXPECT_DOUBLE_EQ(printed(ratio(workload(256, 100, 500)), 2), 9.30);
  EXPECT_DOUBLE_EQ(printed(ratio(workload(256, 100, 100)), 2), 2.17);
  EXPECT_DOUBLE_EQ(printed(ratio(workload(256, 500, 500)), 2), 17.25);
}

TEST(AfdOptimalRatio, BatchAblationIsWithinOnePercentOfThePrintedValues) {
  // Fig. 6 prints 7.08 / 9.34 / 10.31, which no single N reproduces (9.34 also contradicts the
  // 9.30 printed for the same configuration); the seed digest's recommendation is 1%.
  EXPECT_NEAR(ratio(workload(128, 100, 500)), 7.08, 0.01 * 7.08);
  EXPECT_NEAR(ratio(workload(256, 100, 500)), 9.34, 0.01 * 9.34);
  EXPECT_NEAR(ratio(workload(512, 100, 500)), 10.31, 0.01 * 10.31);
}

TEST(AfdOptimalRatio, AsymptoticRecipeMatchesIndependentValues) {
  // N -> infinity with p = 1/(mu_D + 1): T̄ = B(mu_P + mu_D) = 153,600 at the baseline, so
  // r_A = (0.00165·153600 + 50 − 100)/(0.083·256) = 203.44/21.248 = 9.57454...
  AfdWorkload w = workload(256, 100, 500);
  w.requests_per_instance.reset();
  w.convention = DecodeLengthConvention::kPaperDefinition;
  EXPECT_DOUBLE_EQ(afd_horizon_token_load(w), 153600.0);
  auto optimum = afd_optimal_ratio(paper003_latency_model(), w);
  ASSERT_TRUE(optimum.ok());
  EXPECT_NEAR(optimum->ratio, (0.00165 * 153600.0 + 50.0 - 100.0) / (0.083 * 256.0), 1e-12);
  EXPECT_NEAR(optimum->ratio, 9.5745, 5e-5);
  EXPECT_EQ(optimum->binding, AfdRegime::kAttentionBound);
  EXPECT_NEAR(optimum->ratio_comm, (0.022 * 256 + 20 - 100) / (0.083 * 256), 1e-12);
  EXPECT_NEAR(optimum->ratio_peak, std::sqrt(100.0 / (0.083 * 256)), 1e-12);
}

TEST(AfdOptimalRatio, FiniteHorizonEqualsTheSumOfExpectedLoads) {
  // Def. 4.2 summed by hand: B = 4, p = 0.1 (mu_D = 10, steps from one), N = 20, so
  // K = N/(B·p) = 50 steps and E[T_k] = B·mu_P + B·9·(1 − 0.9^k).
  AfdWorkload w;
  w.microbatch = 4;
  w.mean_prefill = 7;
  w.mean_decode = 10;
  w.requests_per_instance = 20;
  w.convention = DecodeLengthConvention::kStepsFromOne;
  double sum = 0.0;
  for (int k = 0; k < 50; ++k) sum += 4 * 7 + 4 * 9 * (1 - std::pow(0.9, k));
  EXPECT_NEAR(afd_horizon_token_load(w), sum / 50, 1e-9 * sum / 50);
  EXPECT_NEAR(afd_expected_token_load(w, 3), 28 + 36 * (1 - 0.729), 1e-12);
  // The large-N approximation drops (1−p)^K, i.e. 0.9^50 ≈ 0.005 of the correction term.
  const double approx = 4 * (7 + 9) - 9.0 * 16 / 20;
  EXPECT_NEAR(afd_horizon_token_load_large_n(w), approx, 1e-12);
  EXPECT_NEAR(afd_horizon_token_load(w), approx, 0.01 * 9.0 * 16 / 20);
}

TEST(AfdOptimalRatio, FiniteNFormAtTheBaseline) {
  // Digest §4.3 test vector: T̄ = 150,073.75 for N = 10,000, p = 1/mu_D.
  EXPECT_NEAR(afd_horizon_token_load(paper003_baseline_workload()), 150073.75, 0.01);
  auto optimum = afd_optimal_ratio(paper003_latency_model(), paper003_baseline_workload());
  ASSERT_TRUE(optimum.ok());
  EXPECT_NEAR(optimum->throughput, 0.7766, 5e-5);
}

TEST(AfdOptimalRatio, EachRegimeCanBind) {
  // Communication-bound, by hand: B = 100, mu_P = 100, mu_D = 100 (steps from one, N -> inf):
  // T̄ = 100·(100 + 99) = 19,900; t_A = 0.001·19900 + 10 = 29.9; t_C = 1·100 + 100 = 200;
  // r_A = (29.9 − 10)/10 = 1.99; r_C = (200 − 10)/10 = 19; r_peak = sqrt(10/10) = 1.
  AfdLatencyModel model{.alpha_attention = 0.001,
                        .beta_attention = 10,
                        .alpha_ffn = 0.1,
                        .beta_ffn = 10,
                        .alpha_comm = 1,
                        .beta_comm = 100};
  AfdWorkload w;
  w.microbatch = 100;
  w.mean_prefill = 100;
  w.mean_decode = 100;
  auto comm = afd_optimal_ratio(model, w);
  ASSERT_TRUE(comm.ok());
  EXPECT_NEAR(comm->ratio_attention, 1.99, 1e-12);
  EXPECT_NEAR(comm->ratio, 19.0, 1e-12);
  EXPECT_EQ(comm->binding, AfdRegime::kCommunicationBound);
  // Eq. 20: 19·100 / (20·(0.1·1900 + 10)) = 0.475.
  EXPECT_NEAR(comm->throughput, 0.475, 1e-12);

  EXPECT_EQ(afd_optimal_ratio(paper003_latency_model(), workload(256, 100, 100))->binding,
            AfdRegime::kFfnBound);
  EXPECT_EQ(afd_optimal_ratio(paper003_latency_model(), workload(256, 100, 500))->binding,
            AfdRegime::kAttentionBound);
}

TEST(AfdOperatingPoint, ThroughputCurveMatchesIndependentValues) {
  // Digest §4.3 table (finite N, p = 1/mu_D): r = 1 -> 0.4301, r = 8 -> 0.7646, r = 32 -> 0.3183.
  const auto model = paper003_latency_model();
  const auto w = paper003_baseline_workload();
  EXPECT_NEAR(afd_operating_point(model, w, 1)->throughput, 0.4301, 5e-5);
  EXPECT_NEAR(afd_operating_point(model, w, 8)->throughput, 0.7646, 5e-5);
  auto at32 = afd_operating_point(model, w, 32);
  ASSERT_TRUE(at32.ok());
  EXPECT_NEAR(at32->throughput, 0.3183, 5e-5);
  EXPECT_EQ(at32->regime, AfdRegime::kFfnBound);
  EXPECT_NEAR(at32->ffn_idle, 0.0, 1e-12);
  EXPECT_NEAR(at32->attention_idle, 1.0 - (0.00165 * 150073.75 + 50) / (0.083 * 32 * 256 + 100),
              1e-6);
  EXPECT_EQ(afd_operating_point(model, w, 1)->regime, AfdRegime::kAttentionBound);
}

TEST(AfdOperatingPoint, OptimumIsTheMaximumOfTheCurve) {
  const auto model = paper003_latency_model();
  for (double mu_d : {100.0, 500.0}) {
    const AfdWorkload w = workload(256, 100, mu_d);
    auto optimum = afd_optimal_ratio(model, w);
    ASSERT_TRUE(optimum.ok());
    EXPECT_NEAR(afd_operating_point(model, w, optimum->ratio)->throughput, optimum->throughput,
                1e-12);
    for (double r = 0.25; r <= 40; r += 0.25) {
      EXPECT_LE(afd_operating_point(model, w, r)->throughput, optimum->throughput + 1e-12) << r;
    }
  }
}

TEST(AfdBestBundle, PicksTheBestSmallIntegerBundle) {
  const auto model = paper003_latency_model();
  const auto w = paper003_baseline_workload();
  auto bundle = afd_best_bundle(model, w, 4);
  ASSERT_TRUE(bundle.ok());
  // Candidates around 9.30·y: 9/1, 10/1, 18/2, 19/2, 27/3, 28/3, 37/4, 38/4. Eq. 6 peaks at
  // r* and falls on both sides, so the best is the candidate that sits closest to its peak.
  double best = 0.0;
  for (int y = 1; y <= 4; ++y) {
    for (int x = 1; x <= 40; ++x) {
      best = std::max(best, afd_operating_point(model, w, double(x) / y)->throughput);
    }
  }
  EXPECT_DOUBLE_EQ(bundle->throughput, best);
  EXPECT_NEAR(double(bundle->attention_instances) / bundle->ffn_instances, 9.30, 0.2);
  EXPECT_FALSE(afd_best_bundle(model, w, 0).ok());
}

TEST(AfdValidation, RejectsNonsenseWithClearMessages) {
  AfdLatencyModel model = paper003_latency_model();
  model.alpha_ffn = -1;
  auto bad_model = afd_optimal_ratio(model, paper003_baseline_workload());
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.status().message().find("alpha_ffn"), std::string::npos);

  AfdWorkload w = paper003_baseline_workload();
  w.microbatch = 0;
  auto bad_b = afd_optimal_ratio(paper003_latency_model(), w);
  ASSERT_FALSE(bad_b.ok());
  EXPECT_NE(bad_b.status().message().find("microbatch B"), std::string::npos);

  w = paper003_baseline_workload();
  w.requests_per_instance = 0;
  EXPECT_NE(afd_optimal_ratio(paper003_latency_model(), w).status().message().find("N ="),
            std::string::npos);

  w = paper003_baseline_workload();
  w.mean_decode = 0.5;  // fewer than one step per request
  EXPECT_FALSE(afd_optimal_ratio(paper003_latency_model(), w).ok());

  EXPECT_FALSE(afd_operating_point(paper003_latency_model(), paper003_baseline_workload(), 0).ok());
  EXPECT_FALSE(
      afd_operating_point(paper003_latency_model(), paper003_baseline_workload(), NAN).ok());
}

}  // namespace
}  // namespace peerserve::plan
