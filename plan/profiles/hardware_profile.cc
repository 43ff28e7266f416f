#include "plan/profiles/hardware_profile.h"

#include "plan/profiles/json_fields.h"

namespace peerserve::plan {
namespace {

LinkProfile read_link(JsonFields fields) {
  fields.reject_unknown_keys({"name", "bandwidth_gb_s", "latency_us", "notes"});
  LinkProfile link;
  link.name = fields.string("name", "the link's name");
  link.bandwidth_gb_s = fields.positive("bandwidth_gb_s", "bandwidth per device in GB/s");
  link.latency_us = fields.non_negative("latency_us", "one-way latency in microseconds");
  return link;
}

nlohmann::json link_to_json(const LinkProfile& link) {
  return {{"name", link.name},
          {"bandwidth_gb_s", link.bandwidth_gb_s},
          {"latency_us", link.latency_us}};
}

}  // namespace

Result<double> HardwareProfile::peak_flops(Precision precision) const {
  auto it = peak_tflops.find(precision);
  if (it != peak_tflops.end()) return it->second * 1e12;
  std::string available;
  for (const auto& [p, tflops] : peak_tflops) {
    if (!available.empty()) available += ", ";
    available += precision_name(p);
  }
  return not_found("hardware '" + name + "' has no peak rate for " +
                   std::string(precision_name(precision)) + " (it lists " + available + ")");
}

const LinkProfile& HardwareProfile::link_for_group(int devices) const {
  return devices <= scale_up_domain ? scale_up : scale_out;
}

Result<LinkProfile> HardwareProfile::memory_pool_path(std::string_view path_name) const {
  auto it = memory_pool_paths.find(std::string(path_name));
  if (it != memory_pool_paths.end()) return it->second;
  std::string available;
  for (const auto& [key, link] : memory_pool_paths) {
    if (!available.empty()) available += ", ";
    available += key;
  }
  return not_found("hardware '" + name + "' has no memory-pool path '" + std::string(path_name) +
                   "' (it lists: " + (available.empty() ? "none" : available) + ")");
}

Result<HardwareProfile> hardware_profile_from_json(const nlohmann::json& json,
                                                   std::string_view source) {
  JsonFields root(json, std::string(source));
  root.reject_unknown_keys(
      {"name", "description", "device_kind", "package_kind", "devices_per_package", "peak_tflops",
       "hbm_capacity_gb", "hbm_bandwidth_gb_s", "reserved_memory_gb", "scale_up", "scale_up_domain",
       "scale_out", "memory_pool_paths", "efficiency", "fixed_costs", "notes", "sources"});
  HardwareProfile hw;
  hw.name = root.string("name", "the profile's name");
  hw.description = root.optional_string("description").value_or("");
  hw.device_kind = root.string("device_kind", "what one device is, e.g. \"die\" or \"GPU\"");
  hw.package_kind = root.optional_string("package_kind").value_or(hw.device_kind);
  hw.devices_per_package = root.has("devices_per_package")
                               ? root.positive_int("devices_per_package", "devices per package")
                               : 1;

  JsonFields peaks = root.object("peak_tflops");
  for (const auto& [key, value] : peaks.json().items()) {
    auto precision = parse_precision(key);
    if (!precision.ok()) {
      peaks.add_error(key, precision.status().message());
      continue;
    }
    const double tflops = peaks.positive(key, "dense peak TFLOPS");
    if (tflops > 0.0) hw.peak_tflops[*precision] = tflops;
  }
  if (peaks.json().empty())
    root.add_error("peak_tflops", "is empty, expected at least one precision");

  hw.hbm_capacity_gb = root.positive("hbm_capacity_gb", "HBM capacity per device in GB");
  hw.hbm_bandwidth_gb_s = root.positive("hbm_bandwidth_gb_s", "HBM bandwidth per device in GB/s");
  hw.reserved_memory_gb =
      root.optional_non_negative("reserved_memory_gb", "memory reserved per device in GB")
          .value_or(0.0);
  if (hw.reserved_memory_gb >= hw.hbm_capacity_gb && hw.hbm_capacity_gb > 0.0) {
    root.add_error("reserved_memory_gb", "leaves no memory: it must be below hbm_capacity_gb");
  }

  hw.scale_up = read_link(root.object("scale_up"));
  hw.scale_up_domain = root.positive_int("scale_up_domain", "devices in one scale-up domain");
  hw.scale_out = read_link(root.object("scale_out"));
  if (auto paths = root.optional_object("memory_pool_paths")) {
    for (const auto& [key, value] : paths->json().items()) {
      hw.memory_pool_paths[key] = read_link(paths->object(key));
    }
  }

  JsonFields eff = root.object("efficiency");
  eff.reject_unknown_keys({"gemm", "attention", "memory", "all_to_all", "prefill", "notes"});
  hw.efficiency.gemm = eff.fraction("gemm", "achieved fraction of GEMM peak");
  hw.efficiency.attention = eff.fraction("attention", "achieved fraction of attention peak");
  hw.efficiency.memory = eff.fraction("memory", "achieved fraction of HBM bandwidth");
  hw.efficiency.all_to_all = eff.fraction("all_to_all", "achieved fraction of link bandwidth");
  hw.efficiency.prefill = eff.fraction("prefill", "prefill fraction of the decode-kernel rates");

  JsonFields fixed = root.object("fixed_costs");
  fixed.reject_unknown_keys({"all_to_all_us", "all_to_all_per_log2_rank_us",
                             "all_to_all_per_token_copy_ns", "decode_step_ms", "prefill_batch_ms",
                             "notes"});
  hw.fixed.all_to_all_us = fixed.non_negative("all_to_all_us", "microseconds per call");
  hw.fixed.all_to_all_per_log2_rank_us =
      fixed.non_negative("all_to_all_per_log2_rank_us", "microseconds per doubling of ranks");
  hw.fixed.all_to_all_per_token_copy_ns =
      fixed.non_negative("all_to_all_per_token_copy_ns", "nanoseconds per token copy");
  hw.fixed.decode_step_ms = fixed.non_negative("decode_step_ms", "milliseconds per decode step");
  hw.fixed.prefill_batch_ms =
      fixed.non_negative("prefill_batch_ms", "milliseconds per prefill batch");

  PS_RETURN_IF_ERROR(root.status());
  return hw;
}

nlohmann::json hardware_profile_to_json(const HardwareProfile& hw) {
  nlohmann::json peaks = nlohmann::json::object();
  for (const auto& [precision, tflops] : hw.peak_tflops) {
    peaks[std::string(precision_name(precision))] = tflops;
  }
  nlohmann::json pools = nlohmann::json::object();
  for (const auto& [key, link] : hw.memory_pool_paths) pools[key] = link_to_json(link);
  return {
      {"name", hw.name},
      {"description", hw.description},
      {"device_kind", hw.device_kind},
      {"package_kind", hw.package_kind},
      {"devices_per_package", hw.devices_per_package},
      {"peak_tflops", peaks},
      {"hbm_capacity_gb", hw.hbm_capacity_gb},
      {"hbm_bandwidth_gb_s", hw.hbm_bandwidth_gb_s},
      {"reserved_memory_gb", hw.reserved_memory_gb},
      {"scale_up", link_to_json(hw.scale_up)},
      {"scale_up_domain", hw.scale_up_domain},
      {"scale_out", link_to_json(hw.scale_out)},
      {"memory_pool_paths", pools},
      {"efficiency",
       {{"gemm", hw.efficiency.gemm},
        {"attention", hw.efficiency.attention},
        {"memory", hw.efficiency.memory},
        {"all_to_all", hw.efficiency.all_to_all},
        {"prefill", hw.efficiency.prefill}}},
      {"fixed_costs",
       {{"all_to_all_us", hw.fixed.all_to_all_us},
        {"all_to_all_per_log2_rank_us", hw.fixed.all_to_all_per_log2_rank_us},
        {"all_to_all_per_token_copy_ns", hw.fixed.all_to_all_per_token_copy_ns},
        {"decode_step_ms", hw.fixed.decode_step_ms},
        {"prefill_batch_ms", hw.fixed.prefill_batch_ms}}},
  };
}

}  // namespace peerserve::plan
