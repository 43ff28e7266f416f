// Paper 000 §4.4.3, Table 2: loading a model into `instances` serving instances from object
// storage, with no cache, a per-node DRAM cache, or a shared memory pool (EMS).
//   cold start:  no cache / local DRAM: every instance pulls the model through the shared
//                bucket: instances x model / bucket bandwidth; pool: one pull, model / bandwidth
//   warm start:  model / (devices per instance x pool-to-device bandwidth per device)
//   DRAM used:   local DRAM: one copy per instance; pool: one copy
//   model switch among `distinct_models`: no cache pulls from storage; a local DRAM cache hits
//                only when the node already holds the target (1 / distinct_models); the pool
//                holds all of them.
#pragma once

#include "base/status.h"

namespace peerserve::plan {

struct ModelLoadingScenario {
  double model_bytes = 0.0;
  int instances = 1;
  int devices_per_instance = 1;
  double storage_bandwidth_gb_s = 0.0;  // object-storage bucket, shared by all instances
  double pool_bandwidth_gb_s = 0.0;     // DRAM pool -> device, per device
  int distinct_models = 1;              // models in rotation for the switch scenario
};

struct LoadingStrategyResult {
  double cold_start_s = 0.0;
  double warm_start_s = -1.0;  // < 0: not applicable (no DRAM copy to start from)
  double dram_models = 0.0;    // DRAM footprint in model sizes
  double switch_hit_rate = 0.0;
  double switch_latency_s = 0.0;
};

struct ModelLoadingResult {
  LoadingStrategyResult no_cache;
  LoadingStrategyResult local_dram;
  LoadingStrategyResult memory_pool;
};

Result<ModelLoadingResult> model_loading(const ModelLoadingScenario& scenario);

}  // namespace peerserve::plan
