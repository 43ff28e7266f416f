// `peerserve plan`: size a deployment analytically (prefill and decode per-layer breakdowns,
// TPOT, throughput, the largest batch under a TPOT SLO, memory per device, dispatch/combine
// buffers, the prefill->decode connection mapping and a prefill:decode instance ratio), and
// `peerserve plan reproduce --out DIR` for the papers' reproduction report. The subcommands
// `plan afd` and `plan placement` come from plan/afd and plan/placement.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "apps/command_registry.h"
#include "apps/plan_command_inputs.h"
#include "plan/afd/afd_cli.h"
#include "plan/analytic/all_to_all.h"
#include "plan/analytic/connection_mapping.h"
#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment_presets.h"
#include "plan/analytic/pd_ratio.h"
#include "plan/analytic/prefill_model.h"
#include "plan/placement/placement_cli.h"
#include "plan/report/reproduction_report.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using plan::DecodeEstimate;
using plan::LayerEstimate;
using plan::PrefillEstimate;

struct PlanOptions {
  std::string data_dir;
  std::string hardware = "ascend-910c";
  std::string model = "deepseek-v3";
  std::string model_config;
  plan_inputs::DeploymentFlags deployment;
  std::optional<double> batch;  // per device; default: the largest under the SLO
  double tpot_slo_ms = 50.0;
  double prompt_tokens = 4096.0;
  double output_tokens = 256.0;
  double reuse = 0.0;
  std::optional<int> mapping_prefill_tp;
  int mapping_decode_tp = 1;
  std::optional<int> device_budget;
  std::string memory_pool_path;
  bool json = false;
};

nlohmann::json layer_json(const LayerEstimate& layer) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& op : layer.operators) {
    ops.push_back({{"name", op.name},
                   {"stream", op.stream == plan::OperatorStream::kAttention ? "attention" : "moe"},
                   {"compute_us", op.compute_s * 1e6},
                   {"link_us", op.link_s * 1e6},
                   {"fixed_us", op.fixed_s * 1e6},
                   {"us", op.seconds() * 1e6}});
  }
  return {{"operators_full_batch", ops},
          {"sequential_us", layer.sequential_s * 1e6},
          {"microbatched_us", layer.microbatched_s * 1e6},
          {"attention_share", layer.attention_share},
          {"microbatched", layer.microbatched},
          {"us", layer.seconds * 1e6}};
}

void print_layer(const char* title, const LayerEstimate& layer) {
  fmt::print("  {} (one pass over the whole batch, all resources):\n", title);
  for (const auto& op : layer.operators) {
    fmt::print("    {:<16} {:>9} {:>10.1f} us", op.name,
               op.stream == plan::OperatorStream::kAttention ? "attention" : "moe",
               op.seconds() * 1e6);
    if (op.communication()) {
      fmt::print("  (cores {:.1f}, link {:.1f}, fixed {:.1f})", op.compute_s * 1e6, op.link_s * 1e6,
                 op.fixed_s * 1e6);
    }
    fmt::print("\n");
  }
  fmt::print(
      "    back to back {:.1f} us; two microbatches {:.1f} us (attention share {:.2f}); "
      "using {}\n",
      layer.sequential_s * 1e6, layer.microbatched_s * 1e6, layer.attention_share,
      layer.microbatched ? "microbatches" : "back to back");
}

int run_plan(const PlanOptions& o) {
  const plan_inputs::DeploymentFlags& flags = o.deployment;
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "peerserve plan: %s\n", status.to_string().c_str());
    return kExitFailure;
  };
  auto data_dir = plan_inputs::resolve_data_dir(o.data_dir);
  if (!data_dir.ok()) return fail(data_dir.status());
  auto hw = plan_inputs::load_hardware(*data_dir, o.hardware);
  if (!hw.ok()) return fail(hw.status());
  auto model = plan_inputs::load_model(o.model, o.model_config);
  if (!model.ok()) return fail(model.status());
  auto decode = o.deployment.decode(*model);
  if (!decode.ok()) return fail(decode.status());
  auto prefill = o.deployment.prefill();
  if (!prefill.ok()) return fail(prefill.status());
  if (Status s = plan_inputs::apply_routing(flags, *model, *prefill, *decode); !s.ok()) {
    return fail(s);
  }
  if (!(o.prompt_tokens >= 1.0) || !(o.output_tokens >= 1.0) ||
      !(o.reuse >= 0.0 && o.reuse < 1.0)) {
    return fail(
        invalid_argument("--prompt-tokens and --output-tokens must be >= 1 and --reuse in [0, 1)"));
  }
  const double mean_context = o.prompt_tokens + o.output_tokens / 2.0;
  const double max_context = o.prompt_tokens + o.output_tokens;

  if (!(o.tpot_slo_ms > 0.0) || !std::isfinite(o.tpot_slo_ms) || o.tpot_slo_ms > 1e9) {
    return fail(invalid_argument("--tpot-slo-ms must be a finite number of ms in (0, 1e9]"));
  }
  // Decode: at --batch, or at the largest batch meeting the SLO.
  auto slo = plan::largest_batch_under_slo(*model, *hw, *decode, o.tpot_slo_ms * 1e-3, mean_context,
                                           max_context);
  if (!slo.ok()) return fail(slo.status());
  double batch = o.batch.value_or(slo->has_value() ? (*slo)->batch_per_device : 1.0);
  auto d = plan::estimate_decode(*model, *hw, *decode, batch, mean_context, max_context);
  if (!d.ok()) return fail(d.status());

  // Prefill: a full batch of this workload's prompts.
  const double requests_per_device =
      std::max(1.0, prefill->max_tokens_per_device / o.prompt_tokens);
  auto p = plan::estimate_prefill(
      *model, *hw, *prefill,
      plan::uniform_prefill_batch(requests_per_device, o.prompt_tokens, o.reuse),
      plan_inputs::memory_pool_path(*hw, o.memory_pool_path));
  if (!p.ok()) return fail(p.status());

  plan::ConnectionMappingOptions mapping_options;
  mapping_options.prefill_tp = o.mapping_prefill_tp.value_or(prefill->attention_tp);
  mapping_options.decode_tp = o.mapping_decode_tp;
  mapping_options.decode_dp = decode->experts.devices / std::max(1, o.mapping_decode_tp);
  auto mapping = plan::prefill_decode_connection_mapping(mapping_options);

  plan::PdWorkload workload{o.prompt_tokens, o.output_tokens, o.reuse};
  auto ratio = plan::recommend_pd_ratio(workload, *p, prefill->experts.devices, *d,
                                        decode->experts.devices, o.device_budget);
  if (!ratio.ok()) return fail(ratio.status());

  if (o.json) {
    nlohmann::json out = {
        {"hardware", plan::hardware_profile_to_json(*hw)},
        {"model", plan::model_profile_to_json(*model)},
        {"decode",
         {{"batch_per_device", d->batch_per_device},
          {"mean_context", d->context_tokens},
          {"moe_layer", layer_json(d->moe_layer)},
          {"dense_layer", layer_json(d->dense_layer)},
          {"mtp_layer_us", d->mtp_layer.seconds * 1e6},
          {"lm_head_us", d->lm_head_s * 1e6},
          {"step_ms", d->step_s * 1e3},
          {"tokens_per_step", d->tokens_per_step},
          {"tpot_ms", d->tpot_s * 1e3},
          {"throughput_per_device", d->throughput_per_device},
          {"throughput_per_package", d->throughput_per_package},
          {"tokens_per_s_per_tflops", d->tokens_per_s_per_tflops},
          {"memory",
           {{"weights_gb", d->memory.weight_bytes / 1e9},
            {"kv_gb", d->memory.kv_bytes / 1e9},
            {"buffers_gb", d->memory.buffer_bytes / 1e9},
            {"reserved_gb", d->memory.reserved_bytes / 1e9},
            {"total_gb", d->memory.total_bytes() / 1e9},
            {"capacity_gb", d->memory.capacity_bytes / 1e9},
            {"fits", d->memory.fits()}}},
          {"buffers",
           {{"max_tokens", d->memory.buffers.max_tokens},
            {"dispatch_mib", d->memory.buffers.dispatch_bytes / 1048576.0},
            {"combine_mib", d->memory.buffers.combine_bytes / 1048576.0}}},
          {"largest_batch_under_slo",
           slo->has_value() ? nlohmann::json((*slo)->batch_per_device) : nlohmann::json(nullptr)},
          {"tpot_slo_ms", o.tpot_slo_ms}}},
        {"prefill",
         {{"new_tokens_per_device", p->batch.new_tokens},
          {"cached_tokens_per_device", p->batch.cached_tokens},
          {"moe_layer", layer_json(p->moe_layer)},
          {"dense_layer", layer_json(p->dense_layer)},
          {"cache_load_ms", p->cache_load_s * 1e3},
          {"batch_ms", p->batch_s * 1e3},
          {"throughput_per_device", p->throughput_per_device},
          {"throughput_per_package", p->throughput_per_package},
          {"tokens_per_s_per_tflops", p->tokens_per_s_per_tflops}}},
        {"pd_ratio",
         {{"prefill_requests_per_s_per_instance", ratio->prefill_requests_per_s},
          {"decode_requests_per_s_per_instance", ratio->decode_requests_per_s},
          {"prefill_instances_per_decode_instance", ratio->prefill_per_decode},
          {"prefill_instances", ratio->prefill_instances},
          {"decode_instances", ratio->decode_instances},
          {"served_requests_per_s", ratio->served_requests_per_s}}},
    };
    if (mapping.ok()) {
      out["connection_mapping"] = {{"prefill_tp", mapping_options.prefill_tp},
                                   {"decode_tp", mapping_options.decode_tp},
                                   {"decode_dp", mapping_options.decode_dp},
                                   {"source", mapping->source},
                                   {"load_per_prefill_rank", mapping->load_per_prefill_rank}};
    } else {
      out["connection_mapping"] = {{"error", mapping.status().message()}};
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }

  const std::string per_package = hw->devices_per_package > 1
                                      ? fmt::format(" ({} {}s per {})", hw->devices_per_package,
                                                    hw->device_kind, hw->package_kind)
                                      : std::string();
  fmt::print("model {} on {}{}, prompt {} / output {} tokens, reuse {:.0f}%\n\n", model->name,
             hw->name, per_package, o.prompt_tokens, o.output_tokens, o.reuse * 100);
  // "X per die, Y per NPU" or just "X per GPU".
  auto rate = [&](double per_device, double per_package_value) {
    return hw->devices_per_package > 1
               ? fmt::format("{:.0f} per {}, {:.0f} per {}", per_device, hw->device_kind,
                             per_package_value, hw->package_kind)
               : fmt::format("{:.0f} per {}", per_device, hw->device_kind);
  };
  fmt::print(
      "DECODE ({}: {} devices, {} redundant experts, {} shared-expert devices, MTP {} x "
      "{:.0f}%, imbalance {:.2f})\n",
      flags.decode_preset, decode->experts.devices, decode->experts.redundant_experts,
      decode->experts.shared_expert_devices, decode->mtp.draft_tokens, decode->mtp.acceptance * 100,
      decode->experts.expert_imbalance);
  fmt::print("  batch {} requests per device, mean KV {:.0f} tokens\n", batch, mean_context);
  print_layer("MoE layer", d->moe_layer);
  print_layer("dense layer", d->dense_layer);
  fmt::print(
      "  step {:.2f} ms = {} MoE x {:.1f} us + {} dense x {:.1f} us + MTP {} x {:.1f} us + LM "
      "head {:.1f} us + fixed {:.2f} ms\n",
      d->step_s * 1e3, model->num_moe_layers(), d->moe_layer.seconds * 1e6, model->num_dense_layers,
      d->dense_layer.seconds * 1e6, decode->mtp.draft_tokens, d->mtp_layer.seconds * 1e6,
      d->lm_head_s * 1e6, d->fixed_s * 1e3);
  fmt::print(
      "  TPOT {:.2f} ms ({:.2f} tokens per request per step); output tokens/s: {}; {:.3f} "
      "tokens/s per TFLOPS\n",
      d->tpot_s * 1e3, d->tokens_per_step,
      rate(d->throughput_per_device, d->throughput_per_package), d->tokens_per_s_per_tflops);
  fmt::print(
      "  memory per device: weights {:.1f} GB + KV {:.1f} GB + buffers {:.2f} GB + "
      "reserved {:.1f} GB = {:.1f} of {:.0f} GB ({})\n",
      d->memory.weight_bytes / 1e9, d->memory.kv_bytes / 1e9, d->memory.buffer_bytes / 1e9,
      d->memory.reserved_bytes / 1e9, d->memory.total_bytes() / 1e9, d->memory.capacity_bytes / 1e9,
      d->memory.fits() ? "fits" : "DOES NOT FIT");
  fmt::print(
      "  dispatch/combine buffers (eq. 1-2): max_tokens {:.0f}, dispatch {:.1f} MiB, "
      "combine {:.1f} MiB\n",
      d->memory.buffers.max_tokens, d->memory.buffers.dispatch_bytes / 1048576.0,
      d->memory.buffers.combine_bytes / 1048576.0);
  if (slo->has_value()) {
    fmt::print(
        "  largest batch with TPOT <= {} ms: {} per device (TPOT {:.2f} ms, {:.0f} "
        "tokens/s per {}){}\n",
        o.tpot_slo_ms, (*slo)->batch_per_device, (*slo)->estimate.tpot_s * 1e3,
        (*slo)->estimate.throughput_per_package, hw->package_kind,
        (*slo)->memory_bound ? ", limited by memory" : "");
  } else {
    fmt::print("  no batch meets TPOT <= {} ms\n", o.tpot_slo_ms);
  }
  fmt::print(
      "\nPREFILL ({}: {} devices, attention TP {}, {:.0f} tokens per device, imbalance {:.2f})\n",
      flags.prefill_preset, prefill->experts.devices, prefill->attention_tp,
      p->batch.new_tokens + p->batch.cached_tokens, prefill->experts.expert_imbalance);
  print_layer("MoE layer", p->moe_layer);
  fmt::print(
      "  batch {:.1f} ms (TTFT of the batch), cache load {:.1f} ms; prompt tokens/s: {}; "
      "{:.3f} tokens/s per TFLOPS\n",
      p->batch_s * 1e3, p->cache_load_s * 1e3,
      rate(p->throughput_per_device, p->throughput_per_package), p->tokens_per_s_per_tflops);
  fmt::print("\nPREFILL -> DECODE CONNECTIONS (prefill TP {}, decode TP {}, decode DP {})\n",
             mapping_options.prefill_tp, mapping_options.decode_tp, mapping_options.decode_dp);
  if (mapping.ok()) {
    const auto& loads = mapping->load_per_prefill_rank;
    const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
    fmt::print(
        "  each prefill TP rank serves {}..{} decode ranks; decode dp 0 tp 0 <- prefill "
        "rank {}, dp {} tp 0 <- prefill rank {}\n",
        *lo, *hi, mapping->source.front().front(), mapping_options.decode_dp - 1,
        mapping->source.back().front());
  } else {
    fmt::print("  {}\n", mapping.status().message());
  }
  fmt::print("\nPREFILL : DECODE RATIO\n");
  fmt::print(
      "  one prefill instance serves {:.1f} requests/s, one decode instance {:.1f}: "
      "{:.2f} prefill instances per decode instance\n",
      ratio->prefill_requests_per_s, ratio->decode_requests_per_s, ratio->prefill_per_decode);
  if (o.device_budget) {
    fmt::print("  with {} devices: {} prefill + {} decode instances serve {:.1f} requests/s\n",
               *o.device_budget, ratio->prefill_instances, ratio->decode_instances,
               ratio->served_requests_per_s);
  }
  return 0;
}

int run_reproduce(const std::string& data_dir_flag, const std::string& out_dir) {
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "peerserve plan reproduce: %s\n", status.to_string().c_str());
    return kExitFailure;
  };
  auto data_dir = plan_inputs::resolve_data_dir(data_dir_flag);
  if (!data_dir.ok()) return fail(data_dir.status());
  auto hardware = plan_inputs::load_all_hardware(*data_dir);
  if (!hardware.ok()) return fail(hardware.status());
  auto report = plan::build_reproduction_report(*hardware);
  if (!report.ok()) return fail(report.status());
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return fail(io_error("cannot create '" + out_dir + "': " + ec.message()));
  auto write = [&](const std::string& name, const std::string& text) -> Status {
    std::ofstream out(fs::path(out_dir) / name);
    out << text;
    out.close();  // the last buffer is written here: check after it
    if (!out) return io_error("cannot write '" + (fs::path(out_dir) / name).string() + "'");
    return ok_status();
  };
  Status status = write("report.md", report->markdown);
  if (status.ok()) status = write("report.json", report->json.dump(2) + "\n");
  for (const auto& chart : report->charts) {
    if (status.ok()) status = write(chart.file_stem + ".svg", chart.svg);
  }
  if (!status.ok()) return fail(status);
  const auto& summary = report->json["summary"];
  fmt::print(
      "wrote {}/report.md, report.json and {} charts: {} rows, {} of {} predictions within "
      "15%\n",
      out_dir, report->charts.size(), summary["rows"].get<int>(),
      summary["within_15_percent"].get<int>(), summary["predictions"].get<int>());
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* plan_cmd = root.add_subcommand(
      "plan", "Size a MoE deployment analytically, or reproduce the papers' tables");
  auto o = std::make_shared<PlanOptions>();
  plan_cmd->add_option(
      "--data-dir", o->data_dir,
      "folder with hardware/*.json (default: $PEERSERVE_DATA_DIR, else ./data, else the "
      "source tree's data/ beside the binary)");
  plan_cmd
      ->add_option("--hardware", o->hardware,
                   "hardware profile: a name of --data-dir's hardware/*.json (without .json) or a "
                   ".json path")
      ->capture_default_str();
  plan_cmd
      ->add_option("--model", o->model,
                   "model preset: " + plan_inputs::joined_names(plan::model_preset_names()))
      ->capture_default_str();
  plan_cmd->add_option("--model-config", o->model_config,
                       "Hugging Face config.json instead of a preset");
  o->deployment.add_to(*plan_cmd);
  plan_cmd->add_option("--batch", o->batch,
                       "decode requests per device (default: the largest under the SLO, or 1 "
                       "when no batch meets it)");
  plan_cmd->add_option("--tpot-slo-ms", o->tpot_slo_ms, "TPOT SLO in ms")->capture_default_str();
  plan_cmd->add_option("--prompt-tokens", o->prompt_tokens, "mean prompt length")
      ->capture_default_str();
  plan_cmd->add_option("--output-tokens", o->output_tokens, "mean output length")
      ->capture_default_str();
  plan_cmd->add_option("--reuse", o->reuse, "fraction of prompt tokens served by the context cache")
      ->capture_default_str();
  plan_cmd
      ->add_option("--mapping-prefill-tp", o->mapping_prefill_tp,
                   "prefill TP size for the connection mapping (default: attention TP)")
      ->check(CLI::Range(1, plan::kMaxDevices));
  plan_cmd->add_option("--mapping-decode-tp", o->mapping_decode_tp, "decode TP size")
      ->check(CLI::Range(1, plan::kMaxDevices))
      ->capture_default_str();
  plan_cmd
      ->add_option("--device-budget", o->device_budget,
                   "total devices to split into instances (at most 1048576)")
      ->check(CLI::Range(1, plan::kMaxDevices));
  plan_cmd->add_option("--memory-pool-path", o->memory_pool_path,
                       "caching-pool path for context-cache hits (default: the hardware's first)");
  plan_cmd->add_flag("--json", o->json, "print JSON instead of text");
  plan_cmd->require_subcommand(0, 1);

  auto* reproduce = plan_cmd->add_subcommand(
      "reproduce", "Write the papers' reproduction report (Markdown, JSON, SVG charts)");
  auto out_dir = std::make_shared<std::string>();
  reproduce->add_option("--out", *out_dir, "output folder")->required();
  reproduce->add_option(
      "--data-dir", o->data_dir,
      "folder with hardware/*.json (default: $PEERSERVE_DATA_DIR, else ./data, else the "
      "source tree's data/ beside the binary)");
  reproduce->callback(
      [o, out_dir] { set_command_exit_code(run_reproduce(o->data_dir, *out_dir)); });

  plan::add_plan_afd_command(*plan_cmd);        // plan/afd/afd_cli.h
  plan::add_plan_placement_command(*plan_cmd);  // plan/placement/placement_cli.h
  // plan's own options mean nothing to a subcommand (`plan --hardware x afd` ran afd and
  // ignored them); --data-dir is reproduce's too.
  for (CLI::App* sub : plan_cmd->get_subcommands({})) {
    for (CLI::Option* option : plan_cmd->get_options()) {
      const std::string name = option->get_name();
      if (name != "--help" && name != "--data-dir") sub->excludes(option);
    }
  }

  plan_cmd->callback([plan_cmd, o] {
    if (!plan_cmd->get_subcommands().empty()) return;  // a subcommand ran instead
    set_command_exit_code(run_plan(*o));
  });
});

}  // namespace
}  // namespace peerserve
