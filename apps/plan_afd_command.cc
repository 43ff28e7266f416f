// `peerserve plan afd`: optimal Attention/FFN ratio (paper 003), the throughput and idle time
// over r (closed form, optionally simulated), r* over B, mu_P or mu_D, and the reproduction
// of the paper's printed numbers. Not a cmd_*.cc file: apps/cmd_plan.cc mounts it under `plan`.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/command_registry.h"
#include "apps/whole_number_validator.h"
#include "plan/afd/afd_cli.h"
#include "plan/afd/afd_reproduction.h"
#include "plan/afd/afd_sweep.h"

namespace peerserve::plan {
namespace {

struct AfdCommandOptions {
  AfdLatencyModel model = paper003_latency_model();
  double microbatch = 256;
  double mean_prefill = 100;
  double mean_decode = 500;
  double requests_per_instance = 10000;  // 0 = N -> infinity
  bool requests_per_instance_set = false;
  std::string convention = "steps-from-one";
  std::vector<double> ratios = {1, 2, 4, 8, 16, 24, 32};
  bool simulate = false;
  int batches_in_flight = 2;
  std::string prefill_distribution = "uniform";
  uint64_t seed = 1;
  std::string sweep;
  std::vector<double> sweep_values;
  int max_ffn = 4;
  bool reproduce = false;
  bool json = false;
};

nlohmann::json optimum_json(const AfdOptimalRatio& o) {
  return {{"token_load", o.token_load},
          {"attention_time", o.attention_time},
          {"comm_time", o.comm_time},
          {"ratio_attention", o.ratio_attention},
          {"ratio_comm", o.ratio_comm},
          {"ratio_peak", o.ratio_peak},
          {"ratio", o.ratio},
          {"binding", afd_regime_name(o.binding)},
          {"throughput_per_instance", o.throughput}};
}

nlohmann::json simulation_json(const AfdSimulationResult& s) {
  return {{"throughput_per_instance_eq21", s.throughput_per_instance},
          {"token_rate_per_instance", s.token_rate_per_instance},
          {"attention_idle", s.attention_idle},
          {"ffn_idle", s.ffn_idle},
          {"mean_tpot", s.mean_tpot},
          {"mean_token_load", s.mean_token_load},
          {"completed_requests", s.completed_requests},
          {"total_time", s.total_time}};
}

int fail(const Status& status) {
  std::fprintf(stderr, "peerserve plan afd: %s\n", status.to_string().c_str());
  return kExitFailure;
}

int run_reproduce(const AfdReproductionOptions& options, bool json) {
  Result<AfdReproduction> computed = afd_reproduction(options);
  if (!computed.ok()) {
    return fail(computed.status().with_context("--requests-per-instance"));
  }
  const AfdReproduction& reproduction = *computed;
  if (json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : reproduction.rows) {
      rows.push_back({{"source", row.source},
                      {"quantity", row.quantity},
                      {"published", row.published},
                      {"predicted", row.predicted},
                      {"relative_error", row.relative_error()},
                      {"note", row.note}});
    }
    std::printf("%s\n", rows.dump(2).c_str());
    return 0;
  }
  for (const auto& row : reproduction.rows) {
    std::printf("%-22s %-66s published %8.3f  predicted %8.3f  (%+.1f%%)\n", row.source.c_str(),
                row.quantity.c_str(), row.published, row.predicted, 100 * row.relative_error());
    if (!row.note.empty()) std::printf("    %s\n", row.note.c_str());
  }
  return 0;
}

int run_afd(const AfdCommandOptions& options) {
  if (options.reproduce) {
    AfdReproductionOptions reproduction;
    if (options.requests_per_instance_set) {
      // The reproduction simulates: N -> infinity (0) has no finite horizon to run.
      if (!(options.requests_per_instance >= 1.0) ||
          !std::isfinite(options.requests_per_instance)) {
        return fail(invalid_argument(
            "--reproduce simulates: --requests-per-instance must be a finite N >= 1"));
      }
      reproduction.simulated_requests_per_instance = options.requests_per_instance;
    }
    return run_reproduce(reproduction, options.json);
  }
  AfdWorkload workload;
  workload.microbatch = options.microbatch;
  workload.mean_prefill = options.mean_prefill;
  workload.mean_decode = options.mean_decode;
  if (options.requests_per_instance > 0)
    workload.requests_per_instance = options.requests_per_instance;
  workload.convention = options.convention == "paper" ? DecodeLengthConvention::kPaperDefinition
                                                      : DecodeLengthConvention::kStepsFromOne;
  Result<AfdOptimalRatio> optimum = afd_optimal_ratio(options.model, workload);
  if (!optimum.ok()) return fail(optimum.status());
  Result<AfdBundle> bundle = afd_best_bundle(options.model, workload, options.max_ffn);
  if (!bundle.ok()) return fail(bundle.status());

  std::optional<AfdSimulationOptions> simulation;
  if (options.simulate) {
    if (!workload.requests_per_instance) {
      return fail(invalid_argument("--simulate needs a finite --requests-per-instance"));
    }
    simulation.emplace();
    simulation->batches_in_flight = options.batches_in_flight;
    simulation->seed = options.seed;
    simulation->prefill_distribution =
        options.prefill_distribution == "constant"      ? PrefillLengthDistribution::kConstant
        : options.prefill_distribution == "exponential" ? PrefillLengthDistribution::kExponential
                                                        : PrefillLengthDistribution::kUniform;
  }
  Result<std::vector<AfdRatioSweepPoint>> sweep =
      afd_ratio_sweep(options.model, workload, options.ratios, simulation);
  if (!sweep.ok()) return fail(sweep.status());
  std::vector<AfdOptimumSweepPoint> parameter_sweep;
  std::string parameter_name;
  if (!options.sweep.empty()) {
    if (options.sweep_values.empty()) {
      return fail(invalid_argument("--sweep " + options.sweep + " needs --values v1,v2,..."));
    }
    Result<AfdSweepParameter> parameter = parse_afd_sweep_parameter(options.sweep);
    if (!parameter.ok()) return fail(parameter.status());
    parameter_name = afd_sweep_parameter_name(*parameter);
    auto points = afd_optimum_sweep(options.model, workload, *parameter, options.sweep_values);
    if (!points.ok()) return fail(points.status());
    parameter_sweep = std::move(points).value();
  }

  if (options.json) {
    nlohmann::json out;
    out["optimum"] = optimum_json(*optimum);
    out["best_bundle"] = {{"attention_instances", bundle->attention_instances},
                          {"ffn_instances", bundle->ffn_instances},
                          {"throughput_per_instance", bundle->throughput}};
    nlohmann::json points = nlohmann::json::array();
    for (const auto& p : *sweep) {
      nlohmann::json point = {{"ratio", p.theory.ratio},
                              {"throughput_per_instance", p.theory.throughput},
                              {"cycle_time", p.theory.cycle_time},
                              {"regime", afd_regime_name(p.theory.regime)},
                              {"fluid_attention_idle", p.theory.attention_idle},
                              {"fluid_ffn_idle", p.theory.ffn_idle}};
      if (p.simulated) point["simulated"] = simulation_json(*p.simulated);
      points.push_back(point);
    }
    out["ratio_sweep"] = points;
    if (!parameter_sweep.empty()) {
      nlohmann::json sweep_json = nlohmann::json::array();
      for (const auto& p : parameter_sweep) {
        sweep_json.push_back({{parameter_name, p.value}, {"optimum", optimum_json(p.optimum)}});
      }
      out["parameter_sweep"] = sweep_json;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  char n_text[32] = "inf";
  if (workload.requests_per_instance) {
    std::snprintf(n_text, sizeof(n_text), "%g", *workload.requests_per_instance);
  }
  std::printf("AFD bundle rA-1F: B=%g mu_P=%g mu_D=%g N=%s p=%.6g\n", workload.microbatch,
              workload.mean_prefill, workload.mean_decode, n_text,
              workload.termination_probability());
  std::printf("  horizon-average token load T = %.2f, t_A = %.3f, t_C = %.3f\n",
              optimum->token_load, optimum->attention_time, optimum->comm_time);
  std::printf("  r_A = %.4f  r_C = %.4f  r_peak = %.4f\n", optimum->ratio_attention,
              optimum->ratio_comm, optimum->ratio_peak);
  std::printf("  r* = %.4f (%s), throughput* = %.5f tokens per time unit per instance\n",
              optimum->ratio, std::string(afd_regime_name(optimum->binding)).c_str(),
              optimum->throughput);
  std::printf("  best bundle with <= %d FFN instances: %dA-%dF, throughput %.5f\n\n",
              options.max_ffn, bundle->attention_instances, bundle->ffn_instances,
              bundle->throughput);
  std::printf("%8s %12s %12s %10s %10s %-20s", "r", "throughput", "cycle", "idle_A", "idle_F",
              "regime");
  if (simulation)
    std::printf(" %12s %12s %10s %10s", "sim_eq21", "sim_rate", "sim_idleA", "sim_idleF");
  std::printf("\n");
  for (const auto& p : *sweep) {
    std::printf("%8.3f %12.5f %12.3f %10.3f %10.3f %-20s", p.theory.ratio, p.theory.throughput,
                p.theory.cycle_time, p.theory.attention_idle, p.theory.ffn_idle,
                std::string(afd_regime_name(p.theory.regime)).c_str());
    if (p.simulated) {
      std::printf(" %12.5f %12.5f %10.3f %10.3f", p.simulated->throughput_per_instance,
                  p.simulated->token_rate_per_instance, p.simulated->attention_idle,
                  p.simulated->ffn_idle);
    }
    std::printf("\n");
  }
  if (!parameter_sweep.empty()) {
    std::printf("\n%10s %10s %12s %-20s\n", parameter_name.c_str(), "r*", "throughput*", "binding");
    for (const auto& p : parameter_sweep) {
      std::printf("%10g %10.4f %12.5f %-20s\n", p.value, p.optimum.ratio, p.optimum.throughput,
                  std::string(afd_regime_name(p.optimum.binding)).c_str());
    }
  }
  return 0;
}

}  // namespace

void add_plan_afd_command(CLI::App& plan) {
  auto* sub = plan.add_subcommand(
      "afd", "Attention/FFN disaggregation: optimal A/F ratio, sweeps and simulation (paper 003)");
  auto options = std::make_shared<AfdCommandOptions>();
  // Units: the paper's "cycles" (its Table 2), or whatever the six were fitted in together.
  sub->add_option("--alpha-attention", options->model.alpha_attention,
                  "Attention time per KV token, in the paper's cycles (default: paper 003 "
                  "Table 2, like the five below)");
  sub->add_option("--beta-attention", options->model.beta_attention,
                  "Attention fixed time per step, cycles");
  sub->add_option("--alpha-ffn", options->model.alpha_ffn,
                  "FFN time per aggregated request, cycles");
  sub->add_option("--beta-ffn", options->model.beta_ffn, "FFN fixed time per step, cycles");
  sub->add_option("--alpha-comm", options->model.alpha_comm, "round-trip time per request, cycles");
  sub->add_option("--beta-comm", options->model.beta_comm, "round-trip fixed time, cycles");
  sub->add_option("--batch", options->microbatch, "B: requests per Attention microbatch")
      ->capture_default_str();
  sub->add_option("--mu-prefill", options->mean_prefill, "mean prompt length")
      ->capture_default_str();
  sub->add_option("--mu-decode", options->mean_decode, "mean decode length")->capture_default_str();
  sub->add_option("--requests-per-instance", options->requests_per_instance,
                  "N, requests per Attention instance over the horizon (0 = N -> infinity); with "
                  "--reproduce, N of the simulated rows")
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  sub->add_option("--convention", options->convention,
                  "steps-from-one: p = 1/mu_D (reproduces the printed values); paper: "
                  "p = 1/(mu_D + 1)")
      ->check(CLI::IsMember({"steps-from-one", "paper"}))
      ->capture_default_str();
  sub->add_option("--ratios", options->ratios,
                  "A/F ratios to evaluate, comma-separated (default 1,2,4,8,16,24,32)")
      ->delimiter(',');
  sub->add_flag("--simulate", options->simulate,
                "also simulate every (whole-number) ratio with the paper's semantics");
  sub->add_option("--batches-in-flight", options->batches_in_flight, "simulator batches in flight")
      ->capture_default_str();
  sub->add_option("--prefill-distribution", options->prefill_distribution,
                  "simulated prompt lengths")
      ->check(CLI::IsMember({"constant", "uniform", "exponential"}))
      ->capture_default_str();
  sub->add_option("--seed", options->seed, "simulator seed")
      ->check(whole_number_at_most())
      ->capture_default_str();
  CLI::Option* sweep =
      sub->add_option("--sweep", options->sweep, "parameter to sweep r* over: B, mu_P or mu_D");
  sub->add_option("--values", options->sweep_values, "values for --sweep")
      ->delimiter(',')
      ->needs(sweep);  // alone they were ignored, silently
  sub->add_option("--max-ffn", options->max_ffn, "largest FFN count for the integer bundle")
      ->capture_default_str();
  sub->add_flag("--reproduce", options->reproduce,
                "print paper 003's published numbers next to peerserve's (with the paper's "
                "parameters: only --requests-per-instance and --json apply)");
  sub->add_flag("--json", options->json, "machine-readable output");
  sub->callback([options, sub] {
    options->requests_per_instance_set = sub->count("--requests-per-instance") > 0;
    set_command_exit_code(run_afd(*options));
  });
}

}  // namespace peerserve::plan
