#include "plan/analytic/model_loading.h"

namespace peerserve::plan {

Result<ModelLoadingResult> model_loading(const ModelLoadingScenario& s) {
  if (!(s.model_bytes > 0.0) || s.instances < 1 || s.devices_per_instance < 1 ||
      !(s.storage_bandwidth_gb_s > 0.0) || !(s.pool_bandwidth_gb_s > 0.0) ||
      s.distinct_models < 1) {
    return invalid_argument(
        "model loading: model_bytes, storage and pool bandwidth must be > 0; instances, "
        "devices_per_instance and distinct_models >= 1");
  }
  const double one_pull = s.model_bytes / (s.storage_bandwidth_gb_s * 1e9);
  const double contended_pull = s.instances * one_pull;
  const double warm = s.model_bytes / (s.devices_per_instance * s.pool_bandwidth_gb_s * 1e9);
  ModelLoadingResult r;
  r.no_cache.cold_start_s = contended_pull;
  r.no_cache.dram_models = 0.0;
  r.no_cache.switch_hit_rate = 0.0;
  r.no_cache.switch_latency_s = one_pull;

  r.local_dram.cold_start_s = contended_pull;
  r.local_dram.warm_start_s = warm;
  r.local_dram.dram_models = s.instances;
  r.local_dram.switch_hit_rate = 1.0 / s.distinct_models;
  r.local_dram.switch_latency_s =
      r.local_dram.switch_hit_rate * warm + (1.0 - r.local_dram.switch_hit_rate) * one_pull;

  r.memory_pool.cold_start_s = one_pull;
  r.memory_pool.warm_start_s = warm;
  r.memory_pool.dram_models = 1.0;
  r.memory_pool.switch_hit_rate = 1.0;
  r.memory_pool.switch_latency_s = warm;
  return r;
}

}  // namespace peerserve::plan
