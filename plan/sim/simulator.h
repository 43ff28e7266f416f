// Discrete-event simulation of a disaggregated deployment: requests arrive, wait in a FIFO
// queue, are prefilled in batches (context-cache hits load from the caching pool instead of
// being computed), have their KV cache sent to a decode instance, and are decoded in
// continuous batches until they have all their tokens. Every batch and step costs what the
// analytical model (plan/analytic) says for its actual size and context, so the simulator
// and `peerserve plan` agree in steady state; the simulator adds queueing, batching, ramp-up,
// drain and the randomness of MTP acceptance. Deterministic for a seed.
//
// Conventions:
// - Prefill produces the first output token: TTFT = prefill end - arrival.
// - A prefill instance takes queued requests in arrival order while their computed tokens fit
//   its budget (max_tokens_per_device x devices; one request always fits).
// - KV transfer: one request's KV over one scale-out link of the hardware (the RDMA plane,
//   paper 000 §4.3.3), latency + bytes / bandwidth; transfers do not contend.
// - Decode instances admit transferred requests at step boundaries up to
//   max_batch_per_device x devices; a request goes to the instance with the fewest requests.
// - Each step gives every active request one token plus, per MTP draft, one more with
//   probability `acceptance` as long as the drafts before it were accepted.
// - TPOT of a request = (finish - first token) / (output tokens - 1), for output >= 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/analytic/deployment.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"
#include "plan/sim/workload.h"

namespace peerserve::plan {

struct SimulationOptions {
  PrefillDeployment prefill;
  int prefill_instances = 1;
  DecodeDeployment decode;
  int decode_instances = 1;
  int max_batch_per_device = 64;  // decode slots per device
  std::string memory_pool_path = "ub";
  uint64_t seed = 1;  // MTP acceptance draws
};

struct RequestRecord {
  int64_t id = 0;
  double arrival_s = 0.0;
  double prefill_start_s = 0.0;
  double first_token_s = 0.0;
  double decode_start_s = 0.0;  // admitted to a decode batch (= first_token_s if output is 1)
  double finish_s = 0.0;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int output_tokens = 0;
  int decode_steps = 0;
  double ttft_s() const { return first_token_s - arrival_s; }
  double e2e_s() const { return finish_s - arrival_s; }
  // NaN-free: 0 when the request has a single output token.
  double tpot_s() const {
    return output_tokens > 1 ? (finish_s - first_token_s) / (output_tokens - 1) : 0.0;
  }
};

struct Distribution {
  int count = 0;
  double mean = 0.0;
  double p50 = 0.0;
  double p90 = 0.0;
  double p99 = 0.0;
  double max = 0.0;
};
// Nearest-rank percentiles.
Distribution summarize(std::vector<double> values);

struct PoolMetrics {
  int instances = 0;
  int devices_per_instance = 0;
  double busy_s = 0.0;       // summed over instances
  double idle_s = 0.0;       // instances x makespan - busy
  double utilization = 0.0;  // busy / (instances x makespan)
  int64_t batches = 0;       // prefill batches or decode steps
  double mean_batch = 0.0;   // requests per prefill batch / per decode step and device
};

struct SimulationResult {
  std::vector<RequestRecord> requests;  // by id
  double makespan_s = 0.0;              // first arrival to last finish
  Distribution ttft_s;
  Distribution tpot_s;  // requests with >= 2 output tokens
  Distribution e2e_s;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0.0;
  double output_tokens_per_s_per_device = 0.0;  // over all prefill and decode devices
  PoolMetrics prefill;
  PoolMetrics decode;
  int64_t events = 0;
};

Result<SimulationResult> simulate(const ModelProfile& model, const HardwareProfile& hw,
                                  const SimulationOptions& options,
                                  const std::vector<SimRequest>& requests);

}  // namespace peerserve::plan
