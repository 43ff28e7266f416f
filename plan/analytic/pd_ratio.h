// How many prefill instances to provision per decode instance for a workload: the ratio that
// makes the two pools' request rates equal.
//   prefill capacity  = requests per batch / batch time                      (requests/s)
//   decode capacity   = concurrent slots / (mean output tokens x TPOT)        (requests/s)
//   prefill instances per decode instance = decode capacity / prefill capacity
#pragma once

#include <optional>

#include "base/status.h"
#include "plan/analytic/decode_model.h"
#include "plan/analytic/prefill_model.h"

namespace peerserve::plan {

struct PdWorkload {
  double mean_prompt_tokens = 0.0;
  double mean_output_tokens = 0.0;
  double reuse_fraction = 0.0;  // prompt tokens served by the context cache
};

struct PdRatio {
  double prefill_requests_per_s = 0.0;  // one prefill instance
  double decode_requests_per_s = 0.0;   // one decode instance
  double prefill_per_decode = 0.0;      // instances
  // With a device budget: the whole numbers of instances that serve the most requests/s.
  int prefill_instances = 0;
  int decode_instances = 0;
  double served_requests_per_s = 0.0;
};

// `prefill` is an estimate for a full batch of this workload's requests on an instance of
// `prefill_devices`; `decode` one at the operating batch on `decode_devices`.
Result<PdRatio> recommend_pd_ratio(const PdWorkload& workload, const PrefillEstimate& prefill,
                                   int prefill_devices, const DecodeEstimate& decode,
                                   int decode_devices,
                                   std::optional<int> device_budget = std::nullopt);

}  // namespace peerserve::plan
