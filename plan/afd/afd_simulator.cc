#include "plan/afd/afd_simulator.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace peerserve::plan {
namespace {

// Uniform in (0, 1], from the top 53 bits (never 0, so log() is finite).
double uniform_open_zero(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
}

class RequestSampler {
 public:
  RequestSampler(const AfdWorkload& workload, PrefillLengthDistribution prefill, uint64_t seed)
      : mean_prefill_(workload.mean_prefill),
        p_(workload.termination_probability()),
        prefill_(prefill),
        rng_(seed) {}

  double prefill_length() {
    switch (prefill_) {
      case PrefillLengthDistribution::kConstant:
        return mean_prefill_;
      case PrefillLengthDistribution::kUniform:
        return 2.0 * mean_prefill_ * (1.0 - uniform_open_zero(rng_));
      case PrefillLengthDistribution::kExponential:
        return -mean_prefill_ * std::log(uniform_open_zero(rng_));
    }
    return mean_prefill_;
  }

  // Decode steps S >= 1 with P(S > s) = (1 − p)^s: the slot survives each step with 1 − p.
  int64_t decode_steps() {
    if (p_ >= 1.0) return 1;
    // Capped before the conversion (a tiny p gives draws past int64); the simulation's work
    // bound keeps mu_D far below the cap.
    const double steps = std::floor(std::log(uniform_open_zero(rng_)) / std::log1p(-p_));
    return 1 + static_cast<int64_t>(std::min(steps, 1e15));
  }

 private:
  double mean_prefill_;
  double p_;
  PrefillLengthDistribution prefill_;
  std::mt19937_64 rng_;
};

// One Attention microbatch of B slots under continuous batching.
class Microbatch {
 public:
  Microbatch(int slots, RequestSampler& sampler) : prefill_(slots), start_(slots), first_(slots) {
    for (int b = 0; b < slots; ++b) admit(b, 0, sampler);
  }

  double token_load() const { return token_load_; }
  int64_t step() const { return step_; }

  struct StepOutcome {
    int64_t completed = 0;
    int64_t tokens_of_completed = 0;
    double tpot_sum = 0.0;
    int64_t tpot_count = 0;
  };

  // Finishes step `step_` at time `now`: every slot emitted one token; finished requests
  // leave and their slots are refilled for the next step.
  StepOutcome finish_step(double now, RequestSampler& sampler) {
    StepOutcome out;
    const auto slots = static_cast<int64_t>(prefill_.size());
    for (int b : fresh_) first_[b] = now;
    fresh_.clear();
    double next_load = token_load_ + static_cast<double>(slots);
    while (!ends_.empty() && ends_.top().first == step_) {
      const int b = ends_.top().second;
      ends_.pop();
      const int64_t tokens = step_ - start_[b] + 1;
      ++out.completed;
      out.tokens_of_completed += tokens;
      if (tokens >= 2) {
        out.tpot_sum += (now - first_[b]) / static_cast<double>(tokens - 1);
        ++out.tpot_count;
      }
      next_load -= prefill_[b] + static_cast<double>(tokens);
      admit(b, step_ + 1, sampler);
      next_load += prefill_[b];
    }
    token_load_ = next_load;
    ++step_;
    return out;
  }

 private:
  void admit(int b, int64_t start, RequestSampler& sampler) {
    prefill_[b] = sampler.prefill_length();
    start_[b] = start;
    fresh_.push_back(b);
    ends_.emplace(start + sampler.decode_steps() - 1, b);
    if (start == 0) token_load_ += prefill_[b];  // later admissions are added by finish_step
  }

  std::vector<double> prefill_;
  std::vector<int64_t> start_;  // step at which the request entered (decode index 0)
  std::vector<double> first_;   // time its first token came back
  std::vector<int> fresh_;      // slots whose request has not emitted its first token yet
  // (last step, slot), earliest first.
  std::priority_queue<std::pair<int64_t, int>, std::vector<std::pair<int64_t, int>>, std::greater<>>
      ends_;
  double token_load_ = 0.0;  // T of the step about to run
  int64_t step_ = 0;
};

}  // namespace

Status AfdSimulationOptions::validate() const {
  if (attention_instances < 1 || attention_instances > 4096) {
    return invalid_argument("AFD simulation: attention instances r = " +
                            std::to_string(attention_instances) + ", expected 1..4096");
  }
  if (batches_in_flight < 1 || batches_in_flight > 16) {
    return invalid_argument("AFD simulation: batches in flight = " +
                            std::to_string(batches_in_flight) + ", expected 1..16");
  }
  if (!(measured_fraction > 0.0 && measured_fraction <= 1.0)) {
    return invalid_argument("AFD simulation: measured fraction = " +
                            std::to_string(measured_fraction) + ", expected in (0, 1]");
  }
  return ok_status();
}

Result<AfdSimulationResult> simulate_afd(const AfdLatencyModel& model, const AfdWorkload& workload,
                                         const AfdSimulationOptions& options) {
  PS_RETURN_IF_ERROR(model.validate());
  PS_RETURN_IF_ERROR(workload.validate());
  PS_RETURN_IF_ERROR(options.validate());
  if (!workload.requests_per_instance) {
    return invalid_argument(
        "AFD simulation: the workload needs a finite N (requests per Attention instance)");
  }
  const double b_real = workload.microbatch;
  if (b_real != std::floor(b_real) || b_real > 1e6) {
    return invalid_argument("AFD simulation: microbatch B = " + std::to_string(b_real) +
                            ", expected a whole number of requests <= 1e6");
  }
  const int slots = static_cast<int>(b_real);
  const int r = options.attention_instances;
  const int num_batches = options.batches_in_flight;
  const double target_real = std::ceil(*workload.requests_per_instance) * r;
  if (target_real > 1e9) {
    return invalid_argument("AFD simulation: r·N = " + std::to_string(target_real) +
                            " requests, expected <= 1e9");
  }
  // Overall bounds on memory and work (each bound above is loose alone): the slots held at
  // once, and the decode steps the horizon holds (r·N requests of mu_D steps on average).
  const double slots_held = static_cast<double>(slots) * r * num_batches;
  if (slots_held > 1e8) {
    return invalid_argument("AFD simulation: r·B·batches in flight = " +
                            std::to_string(slots_held) + " request slots, expected <= 1e8");
  }
  const double decode_steps = target_real * workload.mean_decode;
  if (!(decode_steps <= 1e10)) {
    return invalid_argument("AFD simulation: r·N·mu_D = " + std::to_string(decode_steps) +
                            " decode steps, expected <= 1e10 (lower N or mu_D)");
  }
  const auto target = static_cast<int64_t>(target_real);
  const auto measured =
      static_cast<int64_t>(std::ceil(options.measured_fraction * static_cast<double>(target)));

  RequestSampler sampler(workload, options.prefill_distribution, options.seed);
  // batches[j][i]: batch j's microbatch on Attention instance i.
  std::vector<std::vector<Microbatch>> batches(num_batches);
  for (auto& batch : batches) {
    batch.reserve(r);
    for (int i = 0; i < r; ++i) batch.emplace_back(slots, sampler);
  }
  std::vector<std::vector<double>> ready(num_batches, std::vector<double>(r, 0.0));
  std::vector<double> instance_free(r, 0.0);
  std::vector<double> instance_busy(r, 0.0);
  double ffn_free = 0.0;
  double ffn_busy = 0.0;
  const double half_comm = 0.5 * model.comm_time(b_real);
  const double ffn_time = model.ffn_time(b_real * r);

  AfdSimulationResult out;
  out.attention_instances = r;
  double load_sum = 0.0;
  int64_t load_samples = 0;
  double tpot_sum = 0.0;
  int64_t tpot_count = 0;
  int64_t measured_tokens = 0;
  double measured_time = 0.0;
  bool measured_done = false;
  double now = 0.0;
  for (int64_t round = 0; out.completed_requests < target; ++round) {
    const auto j = static_cast<size_t>(round % num_batches);
    double last_arrival = 0.0;
    for (int i = 0; i < r; ++i) {
      Microbatch& mb = batches[j][i];
      const double start = std::max(instance_free[i], ready[j][i]);
      const double duration = model.attention_time(mb.token_load());
      load_sum += mb.token_load();
      ++load_samples;
      instance_free[i] = start + duration;
      instance_busy[i] += duration;
      last_arrival = std::max(last_arrival, instance_free[i] + half_comm);
    }
    const double ffn_start = std::max(ffn_free, last_arrival);
    ffn_free = ffn_start + ffn_time;
    ffn_busy += ffn_time;
    ++out.ffn_steps;
    now = ffn_free + half_comm;
    for (int i = 0; i < r; ++i) {
      ready[j][i] = now;
      const Microbatch::StepOutcome step = batches[j][i].finish_step(now, sampler);
      out.generated_tokens += slots;
      tpot_sum += step.tpot_sum;
      tpot_count += step.tpot_count;
      if (!measured_done && out.completed_requests + step.completed >= measured) {
        // Completions within one step share a time; take the average tokens for the part of
        // this step's completions that falls inside the measured prefix.
        const int64_t needed = measured - out.completed_requests;
        measured_tokens += step.tokens_of_completed * needed / std::max<int64_t>(1, step.completed);
        measured_time = now;
        measured_done = true;
      } else if (!measured_done) {
        measured_tokens += step.tokens_of_completed;
      }
      out.completed_requests += step.completed;
    }
  }
  out.total_time = now;
  const double instances = r + 1.0;
  out.throughput_per_instance =
      measured_time > 0.0 ? static_cast<double>(measured_tokens) / measured_time / instances : 0.0;
  out.token_rate_per_instance =
      now > 0.0 ? static_cast<double>(out.generated_tokens) / now / instances : 0.0;
  double idle_sum = 0.0;
  for (int i = 0; i < r; ++i) idle_sum += (now - instance_busy[i]) / now;
  out.attention_idle = idle_sum / r;
  out.ffn_idle = (now - ffn_busy) / now;
  out.mean_tpot = tpot_count > 0 ? tpot_sum / static_cast<double>(tpot_count) : 0.0;
  out.mean_token_load = load_samples > 0 ? load_sum / static_cast<double>(load_samples) : 0.0;
  return out;
}

}  // namespace peerserve::plan
