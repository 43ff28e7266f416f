// `peerserve plan placement`: reads routing traces in the published per-request JSON format
// (or generates synthetic ones), places experts with EPLB or paper 004's Remap/Dup, and
// reports max/mean load per rank and the predicted MoE time before and after. Not a
// cmd_*.cc file: apps/cmd_plan.cc mounts it under `plan`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/command_registry.h"
#include "apps/plan_command_inputs.h"
#include "apps/whole_number_validator.h"
#include "plan/placement/placement_cli.h"
#include "plan/placement/placement_study.h"
#include "plan/placement/routing_statistics.h"
#include "plan/placement/synthetic_routing.h"

namespace peerserve::plan {
namespace {

namespace fs = std::filesystem;

struct PlacementCommandOptions {
  std::vector<std::string> traces;
  int num_experts = 0;
  SyntheticRoutingOptions synthetic;
  double max_over_mean = 0.0;  // > 0: choose the Zipf skew that gives this hottest/mean ratio
  std::string write_trace;
  std::string algorithm = "eplb";
  bool compare = false;
  PlacementOptions placement;
  std::string place_from = "prefill";
  std::string evaluate_on = "decode";
  std::string cost = "linear";
  double hidden = 7168;
  double intermediate = 2048;
  double weight_bytes = 1;  // per parameter (FP8)
  double peak_tflops = 989;
  double hbm_tbps = 3.35;
  int batch_tokens = 0;  // roofline: the tokens of one step the cost is evaluated at
  bool stats = false;
  bool json = false;
};

int fail(const Status& status) {
  std::fprintf(stderr, "peerserve plan placement: %s\n", status.to_string().c_str());
  return kExitFailure;
}

Result<std::vector<fs::path>> trace_files(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& input : inputs) {
    std::error_code error;
    if (fs::is_directory(input, error)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::recursive_directory_iterator(input, error)) {
        if (entry.is_regular_file() && entry.path().extension() == ".json") {
          found.push_back(entry.path());
        }
      }
      if (error) return io_error(input + ": " + error.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) return not_found(input + ": no .json trace files in this directory");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(input, error)) {
      files.emplace_back(input);
    } else {
      return not_found(input + (fs::exists(input, error)
                                    ? ": neither a regular file nor a directory"
                                    : ": no such trace file or directory"));
    }
  }
  return files;
}

Result<std::vector<RequestRouting>> read_traces(const std::vector<std::string>& inputs,
                                                int num_experts) {
  PS_ASSIGN_OR_RETURN(std::vector<fs::path> files, trace_files(inputs));
  std::vector<RequestRouting> requests;
  for (const fs::path& file : files) {
    // Bounded as plan's --routing trace: files (it read an 8 GB file whole).
    PS_ASSIGN_OR_RETURN(const std::string text,
                        read_regular_file(file, plan_inputs::kMaxInputFileBytes));
    Result<RequestRouting> request = parse_routing_trace(text, {.num_experts = num_experts});
    if (!request.ok()) return request.status().with_context(file.string());
    requests.push_back(std::move(request).value());
  }
  return requests;
}

Status write_traces(const std::vector<RequestRouting>& requests, const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return io_error(dir + ": " + error.message());
  for (size_t i = 0; i < requests.size(); ++i) {
    const fs::path file = fs::path(dir) / (std::to_string(i) + ".json");
    std::ofstream out(file, std::ios::binary);
    out << routing_trace_to_json(requests[i]) << '\n';
    out.close();  // the last buffer is written here: check after it
    if (!out) return io_error(file.string() + ": write failed");
  }
  return ok_status();
}

Result<ExpertTimeFn> expert_time(const PlacementCommandOptions& o) {
  if (o.cost == "linear") return linear_expert_time();
  const double params = 3.0 * o.hidden * o.intermediate;
  return roofline_expert_time({.flops_per_token = 2.0 * params,
                               .weight_bytes = params * o.weight_bytes,
                               .activation_bytes_per_token = 3.0 * o.hidden,
                               .peak_flops = o.peak_tflops * 1e12,
                               .memory_bandwidth = o.hbm_tbps * 1e12});
}

nlohmann::json evaluation_json(const PlacementEvaluation& e) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : e.layers) {
    layers.push_back({{"rank_load", l.rank_load},
                      {"max", l.max_load},
                      {"mean", l.mean_load},
                      {"moe_time", l.moe_time}});
  }
  return {{"mean_max_over_mean", e.mean_max_over_mean},
          {"worst_max_over_mean", e.worst_max_over_mean},
          {"moe_time", e.moe_time},
          {"layers", layers}};
}

int run_placement(PlacementCommandOptions o) {
  std::vector<RequestRouting> requests;
  int num_experts = o.num_experts;
  if (!o.traces.empty()) {
    if (num_experts < 1) {
      return fail(
          invalid_argument("--experts is required with --trace (routed experts per layer)"));
    }
    Result<std::vector<RequestRouting>> read = read_traces(o.traces, num_experts);
    if (!read.ok()) return fail(read.status());
    requests = std::move(read).value();
  } else {
    if (num_experts > 0) o.synthetic.num_experts = num_experts;
    num_experts = o.synthetic.num_experts;
    if (o.max_over_mean != 0.0) {  // 0: not given
      if (!(o.max_over_mean >= 1.0) || !std::isfinite(o.max_over_mean)) {
        return fail(invalid_argument("--max-over-mean " + std::to_string(o.max_over_mean) +
                                     ": expected a finite ratio >= 1"));
      }
      Result<double> skew =
          zipf_skew_for_max_over_mean(num_experts, o.synthetic.top_k, o.max_over_mean);
      if (!skew.ok()) return fail(skew.status());
      o.synthetic.popularity_skew = *skew;
    }
    Result<SyntheticRouting> synthetic = generate_synthetic_routing(o.synthetic);
    if (!synthetic.ok()) return fail(synthetic.status());
    requests = std::move(synthetic->requests);
  }
  if (!o.write_trace.empty()) {
    Status written = write_traces(requests, o.write_trace);
    if (!written.ok()) return fail(written);
    std::fprintf(stderr, "wrote %zu trace files to %s\n", requests.size(), o.write_trace.c_str());
  }

  Result<RoutingPhase> place_phase = parse_routing_phase(o.place_from);
  Result<RoutingPhase> evaluate_phase = parse_routing_phase(o.evaluate_on);
  if (!place_phase.ok()) return fail(place_phase.status());
  if (!evaluate_phase.ok()) return fail(evaluate_phase.status());
  Result<ExpertRoutingLoad> input = expert_load_from_routing(requests, num_experts, *place_phase);
  Result<ExpertRoutingLoad> evaluation =
      expert_load_from_routing(requests, num_experts, *evaluate_phase);
  if (!input.ok()) return fail(input.status());
  if (!evaluation.ok()) return fail(evaluation.status());
  Result<ExpertTimeFn> time = expert_time(o);
  if (!time.ok()) return fail(time.status());
  ExpertRoutingLoad placement_input = *input;
  ExpertRoutingLoad evaluation_load = *evaluation;
  if (o.cost == "roofline") {
    // A non-linear cost needs the token counts of one step, not of a whole trace (applied to
    // the trace's sums, it took every decode token for one batch: a time ~1/steps of the
    // real one, and conclusions that moved with the trace's length).
    if (o.batch_tokens < 1) {
      return fail(invalid_argument(
          "--cost roofline needs --batch-tokens N: the tokens of one step (a decode batch) "
          "the cost is evaluated at; the loads are scaled to N × top-k pairs per layer"));
    }
    const int top_k = requests.front().top_k;
    const double pairs = static_cast<double>(o.batch_tokens) * top_k;
    placement_input = scale_routing_load(*input, pairs);
    evaluation_load = scale_routing_load(*evaluation, pairs);
  }

  std::vector<PlacementAlgorithm> algorithms;
  if (o.compare) {
    algorithms = {PlacementAlgorithm::kEplb, PlacementAlgorithm::kRemap, PlacementAlgorithm::kDup};
  } else {
    Result<PlacementAlgorithm> algorithm = parse_placement_algorithm(o.algorithm);
    if (!algorithm.ok()) return fail(algorithm.status());
    algorithms = {*algorithm};
  }

  nlohmann::json out;
  if (o.stats) {
    Result<RoutingStatistics> stats = routing_statistics(requests, num_experts);
    if (!stats.ok()) return fail(stats.status());
    const auto& m = stats->max_over_mean;
    const double worst = *std::max_element(m.begin(), m.end());
    double mean = 0.0;
    for (double v : m) mean += v / static_cast<double>(m.size());
    out["statistics"] = {{"max_over_mean_per_layer", m},
                         {"token_repeat_fraction", stats->token_repeat_fraction},
                         {"prefill_decode_top5_10_20_overlap", stats->prefill_decode_top_overlap}};
    if (!o.json) {
      std::printf(
          "routing: %zu requests, %d MoE layers, %d experts; hottest/mean expert load "
          "%.2f (mean over layers), %.2f (worst); adjacent-token overlap %.3f\n",
          requests.size(), input->num_layers(), num_experts, mean, worst,
          stats->token_repeat_fraction);
      if (!stats->prefill_decode_top_overlap.empty()) {
        std::printf("prefill/decode top-5/10/20 overlap: %.2f %.2f %.2f\n",
                    stats->prefill_decode_top_overlap[0], stats->prefill_decode_top_overlap[1],
                    stats->prefill_decode_top_overlap[2]);
      }
    }
  }
  if (!o.json) {
    std::printf("placed from %s load, evaluated on %s load, %d ranks, cost %s\n",
                o.place_from.c_str(), o.evaluate_on.c_str(), o.placement.num_ranks, o.cost.c_str());
    std::printf("%-18s %6s %14s %14s %14s %14s %9s\n", "algorithm", "slots", "max/mean before",
                "max/mean after", "moe_time before", "moe_time after", "speedup");
  }
  nlohmann::json studies = nlohmann::json::array();
  for (PlacementAlgorithm algorithm : algorithms) {
    PlacementOptions options = o.placement;
    options.algorithm = algorithm;
    if (algorithm == PlacementAlgorithm::kRemap || algorithm == PlacementAlgorithm::kContiguous) {
      if (o.compare) options.redundant_per_rank = 0;
    }
    Result<PlacementStudy> study =
        run_placement_study(placement_input, evaluation_load, options, *time);
    if (!study.ok()) return fail(study.status());
    const auto name = std::string(placement_algorithm_name(algorithm));
    if (o.json) {
      studies.push_back({{"algorithm", name},
                         {"slots_per_rank", study->after.slots_per_rank},
                         {"physical_to_logical", study->after.physical_to_logical},
                         {"before", evaluation_json(study->before_evaluation)},
                         {"after", evaluation_json(study->after_evaluation)},
                         {"speedup", study->speedup()}});
    } else {
      std::printf("%-18s %6d %14.3f %14.3f %14.6g %14.6g %9.3f\n", name.c_str(),
                  study->after.num_slots(), study->before_evaluation.mean_max_over_mean,
                  study->after_evaluation.mean_max_over_mean, study->before_evaluation.moe_time,
                  study->after_evaluation.moe_time, study->speedup());
    }
  }
  if (o.json) {
    out["studies"] = studies;
    out["moe_layers"] = input->moe_layers;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "max/mean: max over ranks of token-expert pairs / mean, averaged over layers; "
        "moe_time: sum over layers of the slowest rank (%s)\n",
        o.cost == "linear" ? "token-expert pairs" : "seconds per step");
  }
  return 0;
}

}  // namespace

void add_plan_placement_command(CLI::App& plan) {
  auto* sub = plan.add_subcommand(
      "placement", "Expert placement from routing traces: EPLB, Remap, Dup (paper 004)");
  auto o = std::make_shared<PlacementCommandOptions>();
  sub->add_option("--trace", o->traces,
                  "trace file or directory of per-request JSON files (published format); "
                  "repeatable. Without it, synthetic routing is generated");
  sub->add_option("--experts", o->num_experts,
                  "routed experts per MoE layer, 1 to 65536 (required with --trace; synthetic "
                  "default 256)")
      ->check(CLI::Range(1, 65536));  // 0 and -1 were taken as 'not given'
  sub->add_option("--top-k", o->synthetic.top_k, "synthetic: experts per token")
      ->capture_default_str();
  sub->add_option("--dense-layers", o->synthetic.num_dense_layers,
                  "synthetic: leading dense layers")
      ->capture_default_str();
  sub->add_option("--moe-layers", o->synthetic.num_moe_layers, "synthetic: MoE layers")
      ->capture_default_str();
  sub->add_option("--requests", o->synthetic.num_requests, "synthetic: requests")
      ->capture_default_str();
  sub->add_option("--prefill-min", o->synthetic.min_prefill_tokens, "synthetic: shortest prompt")
      ->capture_default_str();
  sub->add_option("--prefill-max", o->synthetic.max_prefill_tokens, "synthetic: longest prompt")
      ->capture_default_str();
  sub->add_option("--decode-steps", o->synthetic.decode_steps, "synthetic: decode steps")
      ->capture_default_str();
  sub->add_option("--skew", o->synthetic.popularity_skew, "synthetic: Zipf exponent of popularity")
      ->capture_default_str();
  sub->add_option("--max-over-mean", o->max_over_mean,
                  "synthetic: hottest expert's load / mean (sets --skew)");
  sub->add_option("--token-repeat", o->synthetic.token_repeat,
                  "synthetic: probability a token reuses the previous token's experts")
      ->capture_default_str();
  sub->add_option("--layer-follow", o->synthetic.layer_follow,
                  "synthetic: probability a layer follows the previous layer's experts")
      ->capture_default_str();
  sub->add_option("--task-profiles", o->synthetic.num_task_profiles,
                  "synthetic: popularity profiles requests draw from")
      ->capture_default_str();
  sub->add_option("--task-variation", o->synthetic.task_variation,
                  "synthetic: fraction of ranks each profile reshuffles")
      ->capture_default_str();
  sub->add_option("--seed", o->synthetic.seed, "synthetic: seed")
      ->check(whole_number_at_most())
      ->capture_default_str();
  sub->add_option("--write-trace", o->write_trace,
                  "write the requests as <dir>/<n>.json in the published format");
  sub->add_option("--algorithm", o->algorithm,
                  "contiguous, eplb, eplb-hierarchical, eplb-global, remap or dup")
      ->capture_default_str();
  sub->add_flag("--compare", o->compare, "run eplb, remap and dup side by side");
  sub->add_option("--ranks", o->placement.num_ranks, "EP ranks")->capture_default_str();
  sub->add_option("--redundant-per-rank", o->placement.redundant_per_rank,
                  "extra expert slots per rank (eplb, dup)")
      ->capture_default_str();
  sub->add_option("--groups", o->placement.num_groups, "EPLB expert groups")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  sub->add_option("--nodes", o->placement.num_nodes, "EPLB nodes")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  sub->add_option("--place-from", o->place_from, "load the placement sees: prefill, decode, all")
      ->capture_default_str();
  sub->add_option("--evaluate-on", o->evaluate_on, "load the result is judged on")
      ->capture_default_str();
  sub->add_option("--cost", o->cost, "per-replica cost: linear (token count) or roofline")
      ->check(CLI::IsMember({"linear", "roofline"}))
      ->capture_default_str();
  const std::vector<CLI::Option*> roofline_options = {
      sub->add_option("--hidden", o->hidden, "roofline: hidden size")->capture_default_str(),
      sub->add_option("--intermediate", o->intermediate, "roofline: expert intermediate size")
          ->capture_default_str(),
      sub->add_option("--weight-bytes", o->weight_bytes, "roofline: bytes per weight")
          ->capture_default_str(),
      sub->add_option("--peak-tflops", o->peak_tflops, "roofline: achieved dense TFLOP/s")
          ->capture_default_str(),
      sub->add_option("--hbm-tbps", o->hbm_tbps, "roofline: achieved HBM TB/s")
          ->capture_default_str(),
      sub->add_option("--batch-tokens", o->batch_tokens,
                      "roofline (required): tokens in one step, e.g. the decode batch; the loads "
                      "keep their shares and are scaled to this many tokens × top-k per layer")
          ->check(CLI::Range(1, 100000000))};
  sub->parse_complete_callback([o, roofline_options] {
    // Under the linear cost they were ignored, silently.
    for (const CLI::Option* option : roofline_options) {
      if (o->cost != "roofline" && option->count() > 0) {
        throw CLI::ValidationError(option->get_name() +
                                   ": applies to --cost roofline (the cost is " + o->cost + ")");
      }
    }
  });
  sub->add_flag("--stats", o->stats, "print routing statistics (skew, token overlap, P/D overlap)");
  sub->add_flag("--json", o->json, "machine-readable output");
  sub->callback([o] { set_command_exit_code(run_placement(*o)); });
}

}  // namespace peerserve::plan
