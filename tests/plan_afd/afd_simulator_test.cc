// The AFD simulator against the closed forms in the regimes where they must agree, plus
// conservation, determinism and the paper's qualitative idle-time observations.
#include "plan/afd/afd_simulator.h"

#include <gtest/gtest.h>

#include <cmath>

#include "plan/afd/afd_optimal_ratio.h"

namespace peerserve::plan {
namespace {

AfdWorkload small_workload(double n) {
  AfdWorkload w;
  w.microbatch = 64;
  w.mean_prefill = 50;
  w.mean_decode = 40;
  w.requests_per_instance = n;
  return w;
}

TEST(AfdSimulator, AttentionBoundSteadyStateMatchesTheClosedForm) {
  // r = 1 and an FFN much faster than Attention: the one Attention instance never waits, so
  // tokens per time = B / mean step time = B / t_A(mean T). With two batches in flight each
  // microbatch serves N/2 of the instance's N requests, so the closed form uses N/2.
  const AfdLatencyModel model{.alpha_attention = 0.01,
                              .beta_attention = 5,
                              .alpha_ffn = 0.01,
                              .beta_ffn = 1,
                              .alpha_comm = 0.01,
                              .beta_comm = 1};
  const AfdWorkload w = small_workload(20000);
  AfdSimulationOptions options;
  options.attention_instances = 1;
  options.prefill_distribution = PrefillLengthDistribution::kConstant;
  auto sim = simulate_afd(model, w, options);
  ASSERT_TRUE(sim.ok()) << sim.status().to_string();

  AfdWorkload per_microbatch = w;
  per_microbatch.requests_per_instance = *w.requests_per_instance / 2;
  const double load = afd_horizon_token_load(per_microbatch);
  // Sampling error of the step-averaged load: ~7,800 steps per microbatch, correlated over
  // ~mu_D = 40 steps, per-step spread ~sqrt(B)·mu_D ≈ 320 of ~5,700: well under 1%; 2% margin.
  EXPECT_NEAR(sim->mean_token_load, load, 0.02 * load);
  const double rate = w.microbatch / model.attention_time(sim->mean_token_load) / 2.0;
  EXPECT_NEAR(sim->token_rate_per_instance, rate, 0.005 * rate);  // warm-up and last step only
  EXPECT_LT(sim->attention_idle, 0.01);
  EXPECT_GT(sim->ffn_idle, 0.5);
}

TEST(AfdSimulator, FfnBoundSteadyStateMatchesTheClosedForm) {
  // Paper 003 baseline at r = 32: t_F(32·256) = 780 > t_A ≈ 300 + t_C, so the FFN runs back to
  // back and throughput is eq. 6 exactly, whatever the Attention stragglers do.
  AfdWorkload w = paper003_baseline_workload();
  w.requests_per_instance = 2000;
  AfdSimulationOptions options;
  options.attention_instances = 32;
  auto sim = simulate_afd(paper003_latency_model(), w, options);
  ASSERT_TRUE(sim.ok());
  auto theory = afd_operating_point(paper003_latency_model(), w, 32);
  ASSERT_TRUE(theory.ok());
  EXPECT_EQ(theory->regime, AfdRegime::kFfnBound);
  // The only loss is the first round's Attention + transfer (~330 of ~3,900 rounds·780).
  EXPECT_NEAR(sim->token_rate_per_instance, theory->throughput, 0.002 * theory->throughput);
  EXPECT_LT(sim->ffn_idle, 0.002);
  // Paper §5.3: "eta_A > 60% at r = 32".
  EXPECT_GT(sim->attention_idle, 0.6);
  // Eq. 21 counts only finished requests' tokens, so it reads below the token rate.
  EXPECT_LT(sim->throughput_per_instance, sim->token_rate_per_instance);
}

TEST(AfdSimulator, ConservesRequestsAndTokens) {
  AfdWorkload w = small_workload(500);
  AfdSimulationOptions options;
  options.attention_instances = 3;
  auto sim = simulate_afd(paper003_latency_model(), w, options);
  ASSERT_TRUE(sim.ok());
  EXPECT_GE(sim->completed_requests, 3 * 500);
  // Every round steps r microbatches of B slots, each emitting one token.
  EXPECT_EQ(sim->generated_tokens, sim->ffn_steps * 3 * 64);
  EXPECT_GT(sim->mean_tpot, 0.0);
  EXPECT_GE(sim->attention_idle, 0.0);
  EXPECT_LE(sim->attention_idle, 1.0);
  EXPECT_GE(sim->ffn_idle, 0.0);
  EXPECT_LE(sim->ffn_idle, 1.0);
}

TEST(AfdSimulator, IsDeterministicForASeed) {
  AfdWorkload w = small_workload(300);
  AfdSimulationOptions options;
  options.attention_instances = 4;
  options.seed = 7;
  auto a = simulate_afd(paper003_latency_model(), w, options);
  auto b = simulate_afd(paper003_latency_model(), w, options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->total_time, b->total_time);
  EXPECT_EQ(a->generated_tokens, b->generated_tokens);
  EXPECT_EQ(a->mean_token_load, b->mean_token_load);
  options.seed = 8;
  auto c = simulate_afd(paper003_latency_model(), w, options);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->mean_token_load, c->mean_token_load);
}

TEST(AfdSimulator, RejectsWhatItCannotSimulate) {
  AfdWorkload w = small_workload(100);
  w.requests_per_instance.reset();
  auto no_n = simulate_afd(paper003_latency_model(), w, {});
  ASSERT_FALSE(no_n.ok());
  EXPECT_NE(no_n.status().message().find("finite N"), std::string::npos);

  w = small_workload(100);
  w.microbatch = 10.5;
  EXPECT_NE(simulate_afd(paper003_latency_model(), w, {}).status().message().find("whole number"),
            std::string::npos);

  AfdSimulationOptions options;
  options.attention_instances = 0;
  EXPECT_FALSE(simulate_afd(paper003_latency_model(), small_workload(100), options).ok());
  options = {};
  options.measured_fraction = 0;
  EXPECT_FALSE(simulate_afd(paper003_latency_model(), small_workload(100), options).ok());

  // Bounds on the whole: the slots held at once (each bound alone allowed ~6.5e10) and the
  // decode steps of the horizon (a huge mu_D ran for ever, and its draws overflowed int64).
  options = {};
  options.attention_instances = 4096;
  options.batches_in_flight = 16;
  w = small_workload(100);
  w.microbatch = 1e6;
  const auto slots = simulate_afd(paper003_latency_model(), w, options);
  ASSERT_FALSE(slots.ok());
  EXPECT_NE(slots.status().message().find("request slots"), std::string::npos);
  w = small_workload(100);
  w.mean_decode = 1e15;
  const auto steps = simulate_afd(paper003_latency_model(), w, {});
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.status().message().find("decode steps"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::plan
