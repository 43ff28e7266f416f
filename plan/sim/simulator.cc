#include "plan/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <queue>

#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment.h"
#include "plan/analytic/prefill_model.h"

namespace peerserve::plan {
namespace {

enum class EventKind { kArrival, kPrefillDone, kTransferDone, kDecodeStepDone };

struct Event {
  double time = 0.0;
  int64_t sequence = 0;  // ties break in creation order, so runs are reproducible
  EventKind kind = EventKind::kArrival;
  int index = 0;   // request (arrival, transfer) or instance (prefill, decode)
  int target = 0;  // decode instance of a transfer
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct PrefillInstance {
  bool busy = false;
  std::vector<int> batch;
};

struct DecodeInstance {
  bool busy = false;
  std::vector<int> active;
  std::deque<int> pending;
  int assigned = 0;  // active + pending + in transfer
};

class Simulation {
 public:
  Simulation(const ModelProfile& model, const HardwareProfile& hw, const SimulationOptions& options,
             const std::vector<SimRequest>& requests)
      : model_(model),
        hw_(hw),
        options_(options),
        requests_(requests),
        rng_(options.seed),
        prefill_(options.prefill_instances),
        decode_(options.decode_instances) {
    records_.resize(requests.size());
    generated_.assign(requests.size(), 0);
    kv_bytes_per_token_ =
        kv_bytes_per_token(model, bytes_per_element(options.decode.precision.kv_cache));
  }

  Result<SimulationResult> run() {
    for (size_t i = 0; i < requests_.size(); ++i) {
      const SimRequest& r = requests_[i];
      RequestRecord& rec = records_[i];
      rec.id = r.id;
      rec.arrival_s = r.arrival_s;
      rec.prompt_tokens = r.prompt_tokens;
      rec.cached_tokens = r.cached_tokens;
      rec.output_tokens = r.output_tokens;
      push({r.arrival_s, 0, EventKind::kArrival, static_cast<int>(i), 0});
    }
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      ++event_count_;
      switch (e.kind) {
        case EventKind::kArrival:
          prefill_queue_.push_back(e.index);
          break;
        case EventKind::kPrefillDone:
          finish_prefill(e.index);
          break;
        case EventKind::kTransferDone:
          decode_[e.target].pending.push_back(e.index);
          break;
        case EventKind::kDecodeStepDone:
          finish_step(e.index);
          break;
      }
      // Idle instances start work only once every event of this instant is applied, so that
      // requests arriving together are batched together.
      if (events_.empty() || events_.top().time > now_) PS_RETURN_IF_ERROR(start_idle_work());
    }
    return summarize_run();
  }

 private:
  void push(Event e) {
    e.sequence = next_sequence_++;
    events_.push(e);
  }

  Status try_start_prefill(int p) {
    PrefillInstance& inst = prefill_[p];
    if (inst.busy || prefill_queue_.empty()) return ok_status();
    const int devices = options_.prefill.experts.devices;
    const double budget = options_.prefill.max_tokens_per_device * devices;
    PrefillBatch batch;
    double new_tokens = 0.0;
    inst.batch.clear();
    while (!prefill_queue_.empty()) {
      const SimRequest& r = requests_[prefill_queue_.front()];
      const double fresh = r.prompt_tokens - r.cached_tokens;
      if (!inst.batch.empty() && new_tokens + fresh > budget) break;
      new_tokens += fresh;
      batch.new_tokens += fresh;
      batch.cached_tokens += r.cached_tokens;
      batch.attended_context += fresh * causal_mean_context(r.cached_tokens, fresh);
      inst.batch.push_back(prefill_queue_.front());
      prefill_queue_.pop_front();
    }
    batch.new_tokens /= devices;
    batch.cached_tokens /= devices;
    batch.attended_context /= devices;
    PS_ASSIGN_OR_RETURN(PrefillEstimate e, estimate_prefill(model_, hw_, options_.prefill, batch,
                                                            options_.memory_pool_path));
    for (int i : inst.batch) records_[i].prefill_start_s = now_;
    inst.busy = true;
    prefill_busy_s_ += e.batch_s;
    ++prefill_batches_;
    prefill_batched_requests_ += static_cast<int64_t>(inst.batch.size());
    push({now_ + e.batch_s, 0, EventKind::kPrefillDone, p, 0});
    return ok_status();
  }

  Status start_idle_work() {
    for (int p = 0; p < static_cast<int>(prefill_.size()); ++p) {
      PS_RETURN_IF_ERROR(try_start_prefill(p));
    }
    for (int d = 0; d < static_cast<int>(decode_.size()); ++d) {
      if (!decode_[d].busy) PS_RETURN_IF_ERROR(start_step(d));
    }
    return ok_status();
  }

  void finish_prefill(int p) {
    PrefillInstance& inst = prefill_[p];
    for (int i : inst.batch) {
      RequestRecord& rec = records_[i];
      rec.first_token_s = now_;
      generated_[i] = 1;
      if (rec.output_tokens <= 1) {
        rec.decode_start_s = now_;
        rec.finish_s = now_;
        continue;
      }
      int target = 0;
      for (int d = 1; d < static_cast<int>(decode_.size()); ++d) {
        if (decode_[d].assigned < decode_[target].assigned) target = d;
      }
      ++decode_[target].assigned;
      const double transfer =
          hw_.scale_out.latency_us * 1e-6 +
          kv_bytes_per_token_ * rec.prompt_tokens / (hw_.scale_out.bandwidth_gb_s * 1e9);
      push({now_ + transfer, 0, EventKind::kTransferDone, i, target});
    }
    inst.batch.clear();
    inst.busy = false;
  }

  Status start_step(int d) {
    DecodeInstance& inst = decode_[d];
    const int devices = options_.decode.experts.devices;
    const size_t capacity = static_cast<size_t>(options_.max_batch_per_device) * devices;
    double longest = 0.0;  // the longest final context among the active requests
    for (int i : inst.active) {
      longest = std::max(
          longest, static_cast<double>(requests_[i].prompt_tokens + requests_[i].output_tokens));
    }
    // A request is admitted while the busiest die (ceil(n / devices) requests, each counted at
    // the longest final context) still fits its KV in the device's memory, as an engine admits
    // by free KV blocks; otherwise it waits for a request to finish.
    while (!inst.pending.empty() && inst.active.size() < capacity) {
      const int i = inst.pending.front();
      const double context = std::max(
          longest, static_cast<double>(requests_[i].prompt_tokens + requests_[i].output_tokens));
      const double per_die = std::ceil((static_cast<double>(inst.active.size()) + 1.0) / devices);
      PS_ASSIGN_OR_RETURN(DecodeEstimate probe,
                          estimate_decode(model_, hw_, options_.decode, per_die, context, context));
      if (!probe.memory.fits()) {
        if (!inst.active.empty()) break;
        char gb[64];
        std::snprintf(gb, sizeof gb, "%.1f of %.1f GB", probe.memory.total_bytes() / 1e9,
                      probe.memory.capacity_bytes / 1e9);
        return invalid_argument(
            "request " + std::to_string(i) + " (" + std::to_string(requests_[i].prompt_tokens) +
            " prompt + " + std::to_string(requests_[i].output_tokens) +
            " output tokens) needs more memory than a decode device has: " + gb);
      }
      longest = context;
      inst.pending.pop_front();
      records_[i].decode_start_s = now_;
      inst.active.push_back(i);
    }
    if (inst.active.empty()) {
      inst.busy = false;
      return ok_status();
    }
    double context = 0.0;
    for (int i : inst.active) context += requests_[i].prompt_tokens + generated_[i];
    context /= static_cast<double>(inst.active.size());
    // Attention is data-parallel: each request lives on one die, and a step lasts as long as
    // the busiest die's, which holds ceil(n / devices) of them (a fractional share made one
    // 128K request on a 320-die instance cost a tenth of its step).
    const double per_device = static_cast<double>(inst.active.size()) / devices;
    const double busiest = std::ceil(per_device);
    PS_ASSIGN_OR_RETURN(DecodeEstimate e,
                        estimate_decode(model_, hw_, options_.decode, busiest, context, context));
    inst.busy = true;
    decode_busy_s_ += e.step_s;
    ++decode_steps_;
    decode_batch_sum_ += per_device;
    push({now_ + e.step_s, 0, EventKind::kDecodeStepDone, d, 0});
    return ok_status();
  }

  void finish_step(int d) {
    DecodeInstance& inst = decode_[d];
    const MtpOptions& mtp = options_.decode.mtp;
    size_t kept = 0;
    for (size_t k = 0; k < inst.active.size(); ++k) {
      const int i = inst.active[k];
      int tokens = 1;
      for (int draft = 0; draft < mtp.draft_tokens; ++draft) {
        if (rng_.uniform() >= mtp.acceptance) break;
        ++tokens;
      }
      RequestRecord& rec = records_[i];
      generated_[i] = std::min(rec.output_tokens, generated_[i] + tokens);
      ++rec.decode_steps;
      if (generated_[i] >= rec.output_tokens) {
        rec.finish_s = now_;
        --inst.assigned;
      } else {
        inst.active[kept++] = i;
      }
    }
    inst.active.resize(kept);
    inst.busy = false;
  }

  SimulationResult summarize_run() {
    SimulationResult result;
    double first_arrival = 0.0;
    double last_finish = 0.0;
    std::vector<double> ttft;
    std::vector<double> tpot;
    std::vector<double> e2e;
    for (size_t i = 0; i < records_.size(); ++i) {
      const RequestRecord& rec = records_[i];
      first_arrival = i == 0 ? rec.arrival_s : std::min(first_arrival, rec.arrival_s);
      last_finish = std::max(last_finish, rec.finish_s);
      ttft.push_back(rec.ttft_s());
      e2e.push_back(rec.e2e_s());
      if (rec.output_tokens > 1) tpot.push_back(rec.tpot_s());
      result.prompt_tokens += rec.prompt_tokens;
      result.cached_tokens += rec.cached_tokens;
      result.output_tokens += generated_[i];
    }
    result.makespan_s = last_finish - first_arrival;
    result.ttft_s = summarize(std::move(ttft));
    result.tpot_s = summarize(std::move(tpot));
    result.e2e_s = summarize(std::move(e2e));
    const double span = std::max(result.makespan_s, 1e-12);
    result.output_tokens_per_s = result.output_tokens / span;
    const int devices = options_.prefill_instances * options_.prefill.experts.devices +
                        options_.decode_instances * options_.decode.experts.devices;
    result.output_tokens_per_s_per_device = result.output_tokens_per_s / devices;
    auto pool = [span](int instances, int devices_per_instance, double busy, int64_t batches,
                       double batch_sum) {
      PoolMetrics m;
      m.instances = instances;
      m.devices_per_instance = devices_per_instance;
      m.busy_s = busy;
      m.idle_s = std::max(0.0, instances * span - busy);
      m.utilization = busy / (instances * span);
      m.batches = batches;
      m.mean_batch = batches > 0 ? batch_sum / batches : 0.0;
      return m;
    };
    result.prefill =
        pool(options_.prefill_instances, options_.prefill.experts.devices, prefill_busy_s_,
             prefill_batches_, static_cast<double>(prefill_batched_requests_));
    result.decode = pool(options_.decode_instances, options_.decode.experts.devices, decode_busy_s_,
                         decode_steps_, decode_batch_sum_);
    result.events = event_count_;
    result.requests = std::move(records_);
    return result;
  }

  const ModelProfile& model_;
  const HardwareProfile& hw_;
  const SimulationOptions& options_;
  const std::vector<SimRequest>& requests_;
  DeterministicRandom rng_;
  std::vector<PrefillInstance> prefill_;
  std::vector<DecodeInstance> decode_;
  std::deque<int> prefill_queue_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<RequestRecord> records_;
  std::vector<int> generated_;
  double kv_bytes_per_token_ = 0.0;
  double now_ = 0.0;
  int64_t next_sequence_ = 0;
  int64_t event_count_ = 0;
  double prefill_busy_s_ = 0.0;
  int64_t prefill_batches_ = 0;
  int64_t prefill_batched_requests_ = 0;
  double decode_busy_s_ = 0.0;
  int64_t decode_steps_ = 0;
  double decode_batch_sum_ = 0.0;
};

Status validate(const ModelProfile& model, const SimulationOptions& o,
                const std::vector<SimRequest>& requests) {
  if (o.prefill_instances < 1 || o.decode_instances < 1) {
    return invalid_argument("simulate: prefill_instances and decode_instances must be >= 1");
  }
  if (o.max_batch_per_device < 1) {
    return invalid_argument("simulate: max_batch_per_device must be >= 1");
  }
  // Devices are summed in int: bounded as the planner's deployments.
  const int64_t devices = int64_t{o.prefill_instances} * std::max(o.prefill.experts.devices, 1) +
                          int64_t{o.decode_instances} * std::max(o.decode.experts.devices, 1);
  if (devices > kMaxDevices) {
    return invalid_argument("simulate: " + std::to_string(o.prefill_instances) + " prefill and " +
                            std::to_string(o.decode_instances) + " decode instances are " +
                            std::to_string(devices) + " devices, more than " +
                            std::to_string(kMaxDevices));
  }
  PS_RETURN_IF_ERROR(validate_prefill_deployment(o.prefill, model));
  PS_RETURN_IF_ERROR(validate_decode_deployment(o.decode, model));
  if (requests.empty()) return invalid_argument("simulate: no requests");
  for (const SimRequest& r : requests) {
    if (r.prompt_tokens < 1 || r.output_tokens < 1 || r.cached_tokens < 0 ||
        r.cached_tokens >= r.prompt_tokens || !(r.arrival_s >= 0.0) ||
        !std::isfinite(r.arrival_s)) {
      return invalid_argument("simulate: request " + std::to_string(r.id) +
                              " needs prompt >= 1, output >= 1, 0 <= cached < prompt and a "
                              "finite, non-negative arrival time");
    }
  }
  return ok_status();
}

}  // namespace

Distribution summarize(std::vector<double> values) {
  Distribution d;
  d.count = static_cast<int>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0.0;
  for (double v : values) sum += v;
  d.mean = sum / values.size();
  auto rank = [&values](double q) {
    const size_t index = static_cast<size_t>(std::ceil(q * values.size()));
    return values[std::min(values.size() - 1, index == 0 ? 0 : index - 1)];
  };
  d.p50 = rank(0.50);
  d.p90 = rank(0.90);
  d.p99 = rank(0.99);
  d.max = values.back();
  return d;
}

Result<SimulationResult> simulate(const ModelProfile& model, const HardwareProfile& hw,
                                  const SimulationOptions& options,
                                  const std::vector<SimRequest>& requests) {
  PS_RETURN_IF_ERROR(validate(model, options, requests));
  Simulation simulation(model, hw, options, requests);
  return simulation.run();
}

}  // namespace peerserve::plan
