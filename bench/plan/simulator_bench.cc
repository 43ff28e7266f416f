// Simulator speed: 10,000 requests on a 384-die CloudMatrix deployment (2 prefill instances of
// 32 dies + one decode instance of 320 dies). Target: under 10 s. Prints the wall time, its
// ratio to the target, and events per second; also times as many analytical decode-step
// evaluations as the run made, alone, to show how much of the run is the cost model.
//
//   build/bench/plan/plan_simulator_bench [data_dir]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment_presets.h"
#include "plan/sim/simulator.h"
#include "plan/sim/workload.h"

namespace {

using peerserve::plan::HardwareProfile;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const std::string& data_dir) {
  using namespace peerserve::plan;
  const std::string profile = data_dir + "/hardware/ascend-910c.json";
  std::ifstream in(profile);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s (is %s the repository's data folder?)\n",
                 profile.c_str(), data_dir.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto json = nlohmann::json::parse(text.str(), nullptr, false);
  auto hw = hardware_profile_from_json(json, "ascend-910c.json");
  if (!hw.ok()) {
    std::fprintf(stderr, "%s\n", hw.status().to_string().c_str());
    return 1;
  }
  auto model = *model_preset("deepseek-v3");
  SimulationOptions options;
  options.prefill = *prefill_preset("cloudmatrix-prefill");
  options.decode = *decode_preset("cloudmatrix-decode");
  options.prefill_instances = 2;
  options.decode_instances = 1;
  options.max_batch_per_device = 48;

  struct Case {
    const char* name;
    double rate;
    const char* prompt;
    const char* output;
    double reuse;
  };
  const Case cases[] = {
      {"poisson 40 req/s, lognormal prompts, exp outputs, 30% reuse", 40.0, "lognormal:2048:0.6",
       "exp:256", 0.3},
      {"all at once, 4K prompts, 256 outputs", 0.0, "fixed:4096", "fixed:256", 0.0},
      {"all at once, 1K prompts, 1K outputs", 0.0, "fixed:1024", "fixed:1024", 0.0},
  };
  constexpr double kTargetSeconds = 10.0;
  std::printf("plan_simulator_bench: 10,000 requests, 2 x 32 prefill + 1 x 320 decode dies\n");
  for (const Case& c : cases) {
    WorkloadSpec spec;
    spec.num_requests = 10000;
    spec.arrival_rate = c.rate;
    spec.prompt = *parse_length_spec(c.prompt);
    spec.output = *parse_length_spec(c.output);
    spec.reuse_fraction = c.reuse;
    const auto start = std::chrono::steady_clock::now();
    auto requests = generate_requests(spec);
    auto result = simulate(model, *hw, options, *requests);
    const double wall = seconds_since(start);
    if (!result.ok()) {
      std::fprintf(stderr, "%s\n", result.status().to_string().c_str());
      return 1;
    }
    // The analytical evaluations the run made, timed alone.
    const int64_t evaluations = result->decode.batches + result->prefill.batches;
    const auto model_start = std::chrono::steady_clock::now();
    volatile double sink = 0.0;
    for (int64_t i = 0; i < evaluations; ++i) {
      sink = sink + estimate_decode(model, *hw, options.decode, 24 + (i % 24), 4096, 4096)->step_s;
    }
    const double model_time = seconds_since(model_start);
    std::printf(
        "  %-62s %7.3f s (%.4f of the 10 s target), %lld events, %.2e events/s; %lld "
        "decode-step evaluations alone take %.3f s\n",
        c.name, wall, wall / kTargetSeconds, static_cast<long long>(result->events),
        result->events / wall, static_cast<long long>(evaluations), model_time);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "--help" || arg == "-h" || argc > 2 || arg.rfind("-", 0) == 0) {
    std::fprintf(arg == "--help" || arg == "-h" ? stdout : stderr,
                 "usage: plan_simulator_bench [DATA_DIR]\n"
                 "Simulator speed: 10,000 requests on a 384-die CloudMatrix deployment (2 prefill\n"
                 "instances of 32 dies, one decode instance of 320) for several workloads: wall\n"
                 "time against the 10 s target, events per second, and the time the run's\n"
                 "analytical decode-step evaluations take alone.\n"
                 "  DATA_DIR   the repository's data folder, holding hardware/ascend-910c.json\n"
                 "             (default: %s/data)\n",
                 PEERSERVE_BENCH_SOURCE_DIR);
    return arg == "--help" || arg == "-h" ? 0 : 2;
  }
  return run(argc > 1 ? arg : std::string(PEERSERVE_BENCH_SOURCE_DIR) + "/data");
}
