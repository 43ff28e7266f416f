// Synthetic request streams for the simulator: arrival times (Poisson, or all at once),
// prompt and output lengths from simple distributions, and context-cache hits. Deterministic
// for a seed: the generator draws from its own splitmix/xoshiro stream and its own
// distribution code, so the same seed gives the same requests on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve::plan {

enum class LengthDistribution {
  kFixed,        // always `mean`
  kUniform,      // whole numbers in [min, max]
  kExponential,  // geometric-like, mean `mean`, at least 1
  kLognormal,    // mean `mean`, log-space standard deviation `sigma`
};

struct LengthSpec {
  LengthDistribution kind = LengthDistribution::kFixed;
  double mean = 1.0;
  double min = 1.0;
  double max = 1.0;
  double sigma = 0.0;
  int cap = 1 << 20;  // lengths are clamped to [1, cap]
};

// "fixed:4096", "uniform:1024:4096", "exp:256", "lognormal:2048:0.6".
Result<LengthSpec> parse_length_spec(std::string_view text);
std::string length_spec_name(const LengthSpec& spec);

struct WorkloadSpec {
  int num_requests = 1000;
  double arrival_rate = 0.0;  // requests per second (Poisson); 0 = all arrive at time 0
  LengthSpec prompt;
  LengthSpec output;
  // Fraction of every prompt found in the context cache (rounded down to whole tokens; at
  // least one prompt token is always computed).
  double reuse_fraction = 0.0;
  uint64_t seed = 1;
};

Status validate_workload(const WorkloadSpec& spec);

struct SimRequest {
  int64_t id = 0;
  double arrival_s = 0.0;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int output_tokens = 0;  // including the first token, which prefill produces
};

Result<std::vector<SimRequest>> generate_requests(const WorkloadSpec& spec);

// A small deterministic generator (xoshiro256** seeded by splitmix64).
class DeterministicRandom {
 public:
  explicit DeterministicRandom(uint64_t seed);
  uint64_t next();
  double uniform();  // in [0, 1)
  double normal();   // standard normal (Box-Muller)

 private:
  uint64_t state_[4];
};

}  // namespace peerserve::plan
