// The discrete-event simulator: workload generation, conservation, ordering, determinism,
// and agreement with the analytical model in steady state.
#include <gtest/gtest.h>

#include <limits>

#include <cmath>
#include <map>

#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment_presets.h"
#include "plan/analytic/prefill_model.h"
#include "plan/sim/simulator.h"
#include "plan/sim/workload.h"
#include "tests/plan/test_data.h"

namespace peerserve::plan {
namespace {

TEST(Workload, ParsesLengthSpecs) {
  EXPECT_EQ(parse_length_spec("fixed:4096")->mean, 4096);
  auto uniform = parse_length_spec("uniform:100:300");
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->mean, 200);
  EXPECT_EQ(length_spec_name(*uniform), "uniform:100:300");
  EXPECT_EQ(parse_length_spec("lognormal:2048:0.5")->sigma, 0.5);
  for (const char* bad : {"", "fixed", "fixed:abc", "uniform:5:1", "exp:0", "gauss:5",
                          "lognormal:100:-1", "fixed:10:20"}) {
    auto spec = parse_length_spec(bad);
    EXPECT_FALSE(spec.ok()) << bad;
    if (!spec.ok()) {
      EXPECT_NE(spec.status().message().find("length spec"), std::string::npos);
    }
  }
}

// Sample means against the distributions' means; 20k samples keep the standard error of the
// exponential (mean/sqrt(n) = 0.7%) and lognormal (~0.5%) well under the 3% tolerance.
TEST(Workload, SamplesFollowTheirDistributions) {
  WorkloadSpec spec;
  spec.num_requests = 20000;
  spec.arrival_rate = 50.0;
  spec.prompt = *parse_length_spec("exp:1000");
  spec.output = *parse_length_spec("lognormal:300:0.5");
  spec.reuse_fraction = 0.25;
  auto requests = generate_requests(spec);
  ASSERT_TRUE(requests.ok());
  double prompt = 0.0, output = 0.0;
  for (const auto& r : *requests) {
    prompt += r.prompt_tokens;
    output += r.output_tokens;
    EXPECT_EQ(r.cached_tokens,
              std::min(r.prompt_tokens - 1, static_cast<int>(std::floor(r.prompt_tokens * 0.25))));
  }
  EXPECT_NEAR(prompt / spec.num_requests, 1000, 30);
  EXPECT_NEAR(output / spec.num_requests, 300, 9);
  // Poisson arrivals at 50/s: the last of 20k arrives near 400 s (sd ~2.8 s).
  EXPECT_NEAR(requests->back().arrival_s, 400.0, 15.0);
  spec.prompt = *parse_length_spec("uniform:10:20");
  auto uniform = generate_requests(spec);
  ASSERT_TRUE(uniform.ok());
  for (const auto& r : *uniform) {
    EXPECT_GE(r.prompt_tokens, 10);
    EXPECT_LE(r.prompt_tokens, 20);
  }
  spec.reuse_fraction = 1.0;
  EXPECT_FALSE(generate_requests(spec).ok());
}

class SimulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hardware_ = testing::load_hardware_set();
    ASSERT_TRUE(hardware_.count("ascend-910c"));
    model_ = *model_preset("deepseek-v3");
    options_.prefill = *prefill_preset("cloudmatrix-prefill");
    options_.decode = *decode_preset("cloudmatrix-decode");
    options_.prefill_instances = 2;
    options_.decode_instances = 1;
    options_.max_batch_per_device = 16;
  }
  const HardwareProfile& hw() const { return hardware_.at("ascend-910c"); }
  std::vector<SimRequest> workload(int n, const char* prompt, const char* output, double rate,
                                   double reuse = 0.0, uint64_t seed = 1) {
    WorkloadSpec spec;
    spec.num_requests = n;
    spec.arrival_rate = rate;
    spec.prompt = *parse_length_spec(prompt);
    spec.output = *parse_length_spec(output);
    spec.reuse_fraction = reuse;
    spec.seed = seed;
    return *generate_requests(spec);
  }
  HardwareSet hardware_;
  ModelProfile model_;
  SimulationOptions options_;
};

TEST_F(SimulatorTest, EveryRequestFinishesAndTokensAddUp) {
  const auto requests = workload(3000, "uniform:256:4096", "exp:200", 40.0, 0.3);
  auto result = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_EQ(result->requests.size(), requests.size());
  int64_t prompt = 0, cached = 0, output = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimRequest& in = requests[i];
    const RequestRecord& r = result->requests[i];
    prompt += in.prompt_tokens;
    cached += in.cached_tokens;
    output += in.output_tokens;
    EXPECT_EQ(r.id, in.id);
    EXPECT_LE(r.arrival_s, r.prefill_start_s);
    EXPECT_LT(r.prefill_start_s, r.first_token_s);
    EXPECT_LE(r.first_token_s, r.decode_start_s);
    EXPECT_LE(r.decode_start_s, r.finish_s);
    if (in.output_tokens == 1) {
      EXPECT_EQ(r.finish_s, r.first_token_s);
      EXPECT_EQ(r.decode_steps, 0);
    } else {
      // Every step gives at least 1 and at most 2 tokens (one MTP draft).
      EXPECT_GE(r.decode_steps, (in.output_tokens - 1 + 1) / 2);
      EXPECT_LE(r.decode_steps, in.output_tokens - 1);
    }
  }
  EXPECT_EQ(result->prompt_tokens, prompt);
  EXPECT_EQ(result->cached_tokens, cached);
  EXPECT_EQ(result->output_tokens, output);
  EXPECT_EQ(result->ttft_s.count, 3000);
  EXPECT_GT(result->prefill.utilization, 0.0);
  EXPECT_LE(result->prefill.utilization, 1.0 + 1e-9);
  EXPECT_LE(result->decode.utilization, 1.0 + 1e-9);
  EXPECT_NEAR(result->prefill.idle_s + result->prefill.busy_s, 2 * result->makespan_s, 1e-6);
}

TEST_F(SimulatorTest, SameSeedSameRunDifferentSeedDifferentRun) {
  const auto requests = workload(500, "exp:1000", "exp:300", 20.0, 0.0, 3);
  auto a = simulate(model_, hw(), options_, requests);
  auto b = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(a->requests[i].finish_s, b->requests[i].finish_s);
    EXPECT_EQ(a->requests[i].decode_steps, b->requests[i].decode_steps);
  }
  options_.seed = 2;  // other MTP acceptance draws
  auto c = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(c.ok());
  int differ = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    differ += a->requests[i].decode_steps != c->requests[i].decode_steps;
  }
  EXPECT_GT(differ, 100);
}

// Saturated prefill: requests queued at t = 0 leave in full batches, batch k at k x the
// analytical batch time.
TEST_F(SimulatorTest, PrefillMatchesTheClosedFormInSteadyState) {
  options_.prefill_instances = 1;
  const auto requests = workload(640, "fixed:4096", "fixed:2", 0.0);
  auto result = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(result.ok());
  // 8192 tokens per die x 32 dies = 64 prompts of 4096 per batch.
  auto batch = estimate_prefill(model_, hw(), options_.prefill, uniform_prefill_batch(2, 4096, 0));
  ASSERT_TRUE(batch.ok());
  std::map<double, int> per_batch;
  for (const auto& r : result->requests) ++per_batch[r.first_token_s];
  ASSERT_EQ(per_batch.size(), 10u);
  int k = 1;
  for (const auto& [time, count] : per_batch) {
    EXPECT_EQ(count, 64);
    EXPECT_NEAR(time, k * batch->batch_s, 1e-9 * k * batch->batch_s);
    ++k;
  }
  EXPECT_NEAR(result->prefill.mean_batch, 64.0, 1e-12);
}

// Saturated decode: every request decoding at once, MTP off; each request's TPOT is the
// mean step time over its life, which the analytical step time at the mean context matches
// (the step time is nearly linear in context). 1% covers that curvature and the one short
// ramp-up step.
TEST_F(SimulatorTest, DecodeMatchesTheClosedFormInSteadyState) {
  options_.prefill_instances = 40;  // all prompts prefilled in one round
  options_.decode.mtp.draft_tokens = 0;
  options_.max_batch_per_device = 8;
  const int n = 8 * 320;
  const auto requests = workload(n, "fixed:2048", "fixed:513", 0.0);
  auto result = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(result.ok());
  auto closed = estimate_decode(model_, hw(), options_.decode, 8, 2048 + 256, 2048 + 512);
  ASSERT_TRUE(closed.ok());
  EXPECT_NEAR(result->tpot_s.mean, closed->step_s, 0.01 * closed->step_s);
  EXPECT_NEAR(result->decode.mean_batch, 8.0, 0.1);
  // Throughput while decoding = batch x devices / step.
  const double decode_span = result->requests[0].finish_s - result->requests[0].first_token_s;
  EXPECT_NEAR(n * 512 / decode_span, closed->throughput_per_device * 320,
              0.01 * n * 512 / decode_span);
}

// Attention is data-parallel: a request lives on one die, so 32 requests on a 320-die
// instance step as fast as one die with one request, not as a tenth of a request.
TEST_F(SimulatorTest, AFewLongRequestsStepAsTheirBusiestDie) {
  options_.prefill_instances = 16;
  options_.decode.mtp.draft_tokens = 0;
  const auto requests = workload(32, "fixed:131072", "fixed:1024", 0.0);
  auto result = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  // The step at one request per die, between the mean and the final context.
  auto low = estimate_decode(model_, hw(), options_.decode, 1, 131072, 131072);
  auto high = estimate_decode(model_, hw(), options_.decode, 1, 131072 + 1024, 131072 + 1024);
  ASSERT_TRUE(low.ok() && high.ok());
  EXPECT_GE(result->tpot_s.mean, low->step_s * 0.999);
  // TPOT also spreads the KV transfer (9.2 GB at 25 GB/s) over the 1023 later tokens: +0.36 ms.
  // At a fractional batch (0.1 per die) the mean was 38% below the step.
  EXPECT_LE(result->tpot_s.mean, high->step_s + 0.37 / 1023 + 1e-4);
}

// Requests wait for KV room instead of running batches that cannot fit a device (48 requests
// of 32K per die: 135 GB on a 64 GB die); one that never fits is an error, not a hang.
TEST_F(SimulatorTest, AdmissionIsBoundedByDeviceMemory) {
  options_.prefill_instances = 300;
  options_.max_batch_per_device = 64;
  options_.decode.mtp.draft_tokens = 0;
  const auto requests = workload(64 * 320, "fixed:32768", "fixed:32", 0.0);
  auto result = simulate(model_, hw(), options_, requests);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  auto fits =
      largest_batch_under_slo(model_, hw(), options_.decode, 1e9, 32768 + 32, 32768 + 32, 64);
  ASSERT_TRUE(fits.ok() && fits->has_value());
  EXPECT_LT((*fits)->batch_per_device, 64);  // memory binds before the batch limit
  EXPECT_LE(result->decode.mean_batch, (*fits)->batch_per_device + 1e-9);
  const auto huge = simulate(model_, hw(), options_, workload(1, "fixed:1048576", "fixed:8", 0.0));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("needs more memory than a decode device has"),
            std::string::npos)
      << huge.status().message();
}

TEST_F(SimulatorTest, RejectsInvalidInput) {
  auto requests = workload(10, "fixed:100", "fixed:10", 0.0);
  requests[3].cached_tokens = 100;
  auto bad = simulate(model_, hw(), options_, requests);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("request 3"), std::string::npos);
  // An arrival at infinity (an arrival rate of 1e-320 per second) printed NaN everywhere.
  requests = workload(10, "fixed:100", "fixed:10", 0.0);
  requests[4].arrival_s = std::numeric_limits<double>::infinity();
  bad = simulate(model_, hw(), options_, requests);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("request 4"), std::string::npos);
  options_.decode_instances = 0;
  EXPECT_FALSE(simulate(model_, hw(), options_, workload(10, "fixed:100", "fixed:10", 0.0)).ok());
  EXPECT_FALSE(simulate(model_, hw(), options_, {}).ok());
}

TEST(Distribution, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(101 - i);
  const Distribution d = summarize(v);
  EXPECT_EQ(d.count, 100);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.p50, 50);
  EXPECT_DOUBLE_EQ(d.p90, 90);
  EXPECT_DOUBLE_EQ(d.p99, 99);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_EQ(summarize({}).count, 0);
}

}  // namespace
}  // namespace peerserve::plan
