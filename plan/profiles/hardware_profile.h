// One accelerator type as the planner sees it: peak rates, memory, links, and the small set of
// efficiency factors and fixed costs that turn peak rates into achieved ones. Profiles are
// data (data/hardware/*.json); every experiment on a given hardware uses the same profile.
//
// Units: TFLOPS = 1e12 FLOP/s (dense, no sparsity); GB = 1e9 bytes; GB/s = 1e9 bytes/s,
// unidirectional per device; latencies in microseconds.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "plan/profiles/precision.h"

namespace peerserve::plan {

struct LinkProfile {
  std::string name;             // "UB", "NVLink", "InfiniBand"
  double bandwidth_gb_s = 0.0;  // per device, one direction
  double latency_us = 0.0;      // one-way small-message latency
};

// Achieved fractions of peak. Documented per profile with the measurement they come from.
struct EfficiencyFactors {
  double gemm = 0.0;        // large GEMMs, of peak_tflops at the GEMM precision
  double attention = 0.0;   // compute-bound attention kernels, of peak at the attention precision
  double memory = 0.0;      // memory-bound kernels (weight and KV reads), of HBM bandwidth
  double all_to_all = 0.0;  // dispatch/combine payload, of the link bandwidth
  // Prefill runs its operators at this fraction of the rates above (dynamic shapes, vector
  // work, sequence-length skew); decode kernels are captured in static graphs and do not pay it.
  double prefill = 0.0;
};

// Fixed costs that do not scale with bytes or FLOPs.
struct FixedCosts {
  double all_to_all_us = 0.0;                 // per dispatch or combine call
  double all_to_all_per_log2_rank_us = 0.0;   // synchronisation growth with the EP degree
  double all_to_all_per_token_copy_ns = 0.0;  // per (token, expert) message handled by a rank
  double decode_step_ms = 0.0;                // per decode step: sampling, scheduling, launch
  double prefill_batch_ms = 0.0;              // per prefill batch
};

struct HardwareProfile {
  std::string name;  // file stem, e.g. "ascend-910c"
  std::string description;
  std::string device_kind;   // what one device is: "die" or "GPU"
  std::string package_kind;  // what a customer counts: "NPU" or "GPU"
  int devices_per_package = 1;

  std::map<Precision, double> peak_tflops;  // dense, per device
  double hbm_capacity_gb = 0.0;
  double hbm_bandwidth_gb_s = 0.0;
  double reserved_memory_gb = 0.0;  // runtime, workspace and activations, per device

  LinkProfile scale_up;     // NVLink / UB
  int scale_up_domain = 1;  // devices reachable over scale_up
  LinkProfile scale_out;    // InfiniBand / RoCE / RDMA plane
  // Caching-pool (DRAM) to device paths, by name ("ub", "vpc"): effective load bandwidth per
  // device including the pool's software path, used by context and model caching.
  std::map<std::string, LinkProfile> memory_pool_paths;

  EfficiencyFactors efficiency;
  FixedCosts fixed;

  // Peak dense FLOP/s at `precision`, or NotFound naming the precisions this hardware has.
  Result<double> peak_flops(Precision precision) const;
  // The link used between `devices` devices: scale-up when they fit in one domain.
  const LinkProfile& link_for_group(int devices) const;
  Result<LinkProfile> memory_pool_path(std::string_view name) const;
};

// Parses and validates a profile; `source` names the file in error messages. Every missing or
// nonsensical value is reported (negative bandwidth, efficiency outside (0, 1], ...).
Result<HardwareProfile> hardware_profile_from_json(const nlohmann::json& json,
                                                   std::string_view source);
nlohmann::json hardware_profile_to_json(const HardwareProfile& profile);

}  // namespace peerserve::plan
