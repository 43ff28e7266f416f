// `peerserve simulate`: discrete-event simulation of a disaggregated deployment (prefill
// pool, KV transfer, decode pool with continuous batching), with per-step costs from the
// analytical model. Prints TTFT/TPOT/end-to-end distributions, throughput, and utilization
// and idle time per pool; deterministic for a --seed.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "apps/command_registry.h"
#include "apps/plan_command_inputs.h"
#include "apps/whole_number_validator.h"
#include "base/output_file_check.h"
#include "plan/analytic/deployment.h"
#include "plan/sim/simulator.h"
#include "plan/sim/workload.h"

namespace peerserve {
namespace {

struct SimulateOptions {
  std::string data_dir;
  std::string hardware = "ascend-910c";
  std::string model = "deepseek-v3";
  std::string model_config;
  plan_inputs::DeploymentFlags deployment;
  int prefill_instances = 2;
  int decode_instances = 1;
  int max_batch_per_device = 48;
  int requests = 10000;
  double arrival_rate = 0.0;
  std::string prompt = "fixed:4096";
  std::string output = "fixed:256";
  double reuse = 0.0;
  uint64_t seed = 1;
  std::string memory_pool_path;
  std::string requests_csv;
  bool json = false;
};

nlohmann::json distribution_json(const plan::Distribution& d, double scale) {
  return {{"count", d.count},     {"mean", d.mean * scale}, {"p50", d.p50 * scale},
          {"p90", d.p90 * scale}, {"p99", d.p99 * scale},   {"max", d.max * scale}};
}

nlohmann::json pool_json(const plan::PoolMetrics& p) {
  return {{"instances", p.instances},     {"devices_per_instance", p.devices_per_instance},
          {"busy_s", p.busy_s},           {"idle_s", p.idle_s},
          {"utilization", p.utilization}, {"batches", p.batches},
          {"mean_batch", p.mean_batch}};
}

int run_simulate(const SimulateOptions& o) {
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "peerserve simulate: %s\n", status.to_string().c_str());
    return kExitFailure;
  };
  // Before the simulation (minutes for 10^7 requests), not after it.
  if (!o.requests_csv.empty()) {
    if (Status s = check_output_file("--requests-csv", o.requests_csv); !s.ok()) return fail(s);
  }
  auto data_dir = plan_inputs::resolve_data_dir(o.data_dir);
  if (!data_dir.ok()) return fail(data_dir.status());
  auto hw = plan_inputs::load_hardware(*data_dir, o.hardware);
  if (!hw.ok()) return fail(hw.status());
  auto model = plan_inputs::load_model(o.model, o.model_config);
  if (!model.ok()) return fail(model.status());
  plan::SimulationOptions sim;
  auto decode = o.deployment.decode(*model);
  if (!decode.ok()) return fail(decode.status());
  auto prefill = o.deployment.prefill();
  if (!prefill.ok()) return fail(prefill.status());
  if (Status st = plan_inputs::apply_routing(o.deployment, *model, *prefill, *decode); !st.ok()) {
    return fail(st);
  }
  sim.decode = *decode;
  sim.prefill = *prefill;
  sim.prefill_instances = o.prefill_instances;
  sim.decode_instances = o.decode_instances;
  sim.max_batch_per_device = o.max_batch_per_device;
  sim.memory_pool_path = plan_inputs::memory_pool_path(*hw, o.memory_pool_path);
  sim.seed = o.seed;

  plan::WorkloadSpec workload;
  workload.num_requests = o.requests;
  workload.arrival_rate = o.arrival_rate;
  workload.reuse_fraction = o.reuse;
  workload.seed = o.seed;
  auto prompt = plan::parse_length_spec(o.prompt);
  if (!prompt.ok()) return fail(prompt.status().with_context("--prompt"));
  auto output = plan::parse_length_spec(o.output);
  if (!output.ok()) return fail(output.status().with_context("--output"));
  workload.prompt = *prompt;
  workload.output = *output;
  auto requests = plan::generate_requests(workload);
  if (!requests.ok()) return fail(requests.status());
  auto result = plan::simulate(*model, *hw, sim, *requests);
  if (!result.ok()) return fail(result.status());

  if (!o.requests_csv.empty()) {
    std::ofstream csv(o.requests_csv);
    csv << "id,arrival_s,prefill_start_s,first_token_s,decode_start_s,finish_s,prompt_tokens,"
           "cached_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n";
    for (const auto& r : result->requests) {
      csv << fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{},{},{:.6f},{:.6f},{:.6f}\n",
                         r.id, r.arrival_s, r.prefill_start_s, r.first_token_s, r.decode_start_s,
                         r.finish_s, r.prompt_tokens, r.cached_tokens, r.output_tokens, r.ttft_s(),
                         r.tpot_s(), r.e2e_s());
    }
    csv.close();  // the last buffer is written here: check after it
    if (!csv) return fail(io_error("cannot write '" + o.requests_csv + "'"));
  }

  if (o.json) {
    nlohmann::json out = {
        {"makespan_s", result->makespan_s},
        {"ttft_ms", distribution_json(result->ttft_s, 1e3)},
        {"tpot_ms", distribution_json(result->tpot_s, 1e3)},
        {"e2e_s", distribution_json(result->e2e_s, 1.0)},
        {"prompt_tokens", result->prompt_tokens},
        {"cached_tokens", result->cached_tokens},
        {"output_tokens", result->output_tokens},
        {"output_tokens_per_s", result->output_tokens_per_s},
        {"output_tokens_per_s_per_device", result->output_tokens_per_s_per_device},
        {"prefill", pool_json(result->prefill)},
        {"decode", pool_json(result->decode)},
        {"events", result->events},
    };
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  auto line = [](const char* name, const plan::Distribution& d, double scale, const char* unit) {
    fmt::print("  {:<5} mean {:9.2f}  p50 {:9.2f}  p90 {:9.2f}  p99 {:9.2f}  max {:9.2f} {}\n",
               name, d.mean * scale, d.p50 * scale, d.p90 * scale, d.p99 * scale, d.max * scale,
               unit);
  };
  fmt::print(
      "{} requests (prompt {}, output {}, reuse {:.0f}%, {}) on {} x {} prefill + {} x "
      "{} decode {}s of {}, seed {}\n",
      o.requests, o.prompt, o.output, o.reuse * 100,
      o.arrival_rate > 0 ? fmt::format("{} req/s", o.arrival_rate) : "all at once",
      o.prefill_instances, sim.prefill.experts.devices, o.decode_instances,
      sim.decode.experts.devices, hw->device_kind, hw->name, o.seed);
  line("TTFT", result->ttft_s, 1e3, "ms");
  if (result->tpot_s.count > 0) {
    line("TPOT", result->tpot_s, 1e3, "ms");
  } else {
    fmt::print("  TPOT  (none: no request produced a second token)\n");
  }
  line("e2e", result->e2e_s, 1.0, "s");
  fmt::print("  makespan {:.2f} s; {} output tokens: {:.0f} tokens/s, {:.1f} per device\n",
             result->makespan_s, result->output_tokens, result->output_tokens_per_s,
             result->output_tokens_per_s_per_device);
  for (const auto* pool : {&result->prefill, &result->decode}) {
    fmt::print("  {:<8} utilization {:5.1f}%, idle {:.2f} instance-s, {} {} (mean {:.2f} {})\n",
               pool == &result->prefill ? "prefill" : "decode", pool->utilization * 100,
               pool->idle_s, pool->batches, pool == &result->prefill ? "batches" : "steps",
               pool->mean_batch,
               pool == &result->prefill ? "requests per batch" : "requests per device");
  }
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "simulate", "Discrete-event simulation of prefill/decode pools with the planner's costs");
  auto o = std::make_shared<SimulateOptions>();
  cmd->add_option(
      "--data-dir", o->data_dir,
      "folder with hardware/*.json (default: $PEERSERVE_DATA_DIR, else ./data, else the "
      "source tree's data/ beside the binary)");
  cmd->add_option("--hardware", o->hardware,
                  "hardware profile: a name of --data-dir's hardware/*.json (without .json) or a "
                  ".json path")
      ->capture_default_str();
  cmd->add_option("--model", o->model,
                  "model preset: " + plan_inputs::joined_names(plan::model_preset_names()))
      ->capture_default_str();
  cmd->add_option("--model-config", o->model_config, "Hugging Face config.json instead");
  o->deployment.add_to(*cmd);
  // Devices in all are bounded as the planner's (plan::kMaxDevices); the simulator checks the
  // product with each instance's devices.
  cmd->add_option("--prefill-instances", o->prefill_instances, "prefill instances (1 to 1048576)")
      ->check(CLI::Range(1, plan::kMaxDevices))
      ->capture_default_str();
  cmd->add_option("--decode-instances", o->decode_instances, "decode instances (1 to 1048576)")
      ->check(CLI::Range(1, plan::kMaxDevices))
      ->capture_default_str();
  cmd->add_option("--max-batch", o->max_batch_per_device,
                  "decode requests per device at most (1 to 1048576)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--requests", o->requests, "number of requests (at most 10,000,000)")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  cmd->add_option("--arrival-rate", o->arrival_rate, "Poisson requests/s (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--prompt", o->prompt,
                  "prompt lengths in tokens: fixed:N, uniform:A:B, exp:M, lognormal:M:S (S in "
                  "[0, 10]); stated lengths at most 1048576, sampled ones rounded and clamped "
                  "to [1, 1048576]")
      ->capture_default_str();
  cmd->add_option("--output", o->output, "output lengths (same forms)")->capture_default_str();
  cmd->add_option("--reuse", o->reuse, "fraction of each prompt in the context cache")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed")
      ->check(whole_number_at_most())
      ->capture_default_str();
  cmd->add_option("--memory-pool-path", o->memory_pool_path,
                  "caching-pool path for context-cache hits (default: the hardware's first)");
  cmd->add_option("--requests-csv", o->requests_csv, "write one line per request here");
  cmd->add_flag("--json", o->json, "print JSON instead of text");
  cmd->callback([o] { set_command_exit_code(run_simulate(*o)); });
});

}  // namespace
}  // namespace peerserve
