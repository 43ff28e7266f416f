#include "plan/analytic/pd_ratio.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace peerserve::plan {

Result<PdRatio> recommend_pd_ratio(const PdWorkload& workload, const PrefillEstimate& prefill,
                                   int prefill_devices, const DecodeEstimate& decode,
                                   int decode_devices, std::optional<int> device_budget) {
  if (!(workload.mean_prompt_tokens > 0.0) || !(workload.mean_output_tokens > 0.0)) {
    return invalid_argument("P/D ratio: mean prompt and output tokens must be > 0");
  }
  if (prefill_devices < 1 || decode_devices < 1) {
    return invalid_argument("P/D ratio: instance sizes must be >= 1 device");
  }
  if (!(prefill.batch_s > 0.0) || !(decode.tpot_s > 0.0) || !std::isfinite(prefill.batch_s) ||
      !std::isfinite(decode.tpot_s)) {
    return invalid_argument("P/D ratio: estimates must have positive batch time and TPOT");
  }
  PdRatio r;
  const double prompt_tokens_per_batch =
      (prefill.batch.new_tokens + prefill.batch.cached_tokens) * prefill_devices;
  r.prefill_requests_per_s =
      prompt_tokens_per_batch / workload.mean_prompt_tokens / prefill.batch_s;
  const double slots = decode.batch_per_device * decode_devices;
  r.decode_requests_per_s = slots / (workload.mean_output_tokens * decode.tpot_s);
  r.prefill_per_decode = r.decode_requests_per_s / r.prefill_requests_per_s;
  if (device_budget) {
    if (*device_budget > kMaxDevices) {
      return invalid_argument("P/D ratio: a budget of " + std::to_string(*device_budget) +
                              " devices, expected at most " + std::to_string(kMaxDevices));
    }
    if (*device_budget < prefill_devices + decode_devices) {
      return invalid_argument("P/D ratio: a budget of " + std::to_string(*device_budget) +
                              " devices cannot hold one prefill (" +
                              std::to_string(prefill_devices) + ") and one decode (" +
                              std::to_string(decode_devices) + ") instance");
    }
    // 64-bit products: d * decode_devices overflowed an int near a budget of 2^31 (the loop
    // then never ended).
    const int64_t budget = *device_budget;
    for (int64_t d = 1; d * decode_devices + prefill_devices <= budget; ++d) {
      const int64_t p = (budget - d * decode_devices) / prefill_devices;
      const double served = std::min(p * r.prefill_requests_per_s, d * r.decode_requests_per_s);
      if (served > r.served_requests_per_s) {
        r.served_requests_per_s = served;
        r.prefill_instances = static_cast<int>(p);
        r.decode_instances = static_cast<int>(d);
      }
    }
  }
  return r;
}

}  // namespace peerserve::plan
