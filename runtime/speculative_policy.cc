#include "runtime/speculative_policy.h"

#include <cstdio>

#include "base/check.h"

namespace peerserve {
namespace {

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

}  // namespace

SpeculativePolicy decide_speculative_policy(const std::vector<SpeculativeCost>& costs,
                                            const SpeculativePolicyOptions& options) {
  PS_CHECK(!costs.empty());
  SpeculativePolicy policy;
  const SpeculativeCost& first = costs.front();
  policy.break_even_acceptance = first.break_even_acceptance();
  const double prior = options.prior_acceptance;
  size_t paying = 0;  // leading batch sizes where drafting pays
  while (paying < costs.size() && costs[paying].speedup(prior) >= options.min_speedup) ++paying;
  policy.reason = format(
      "at batch %d a speculative step (verification, then the MTP layer) costs %.2fx a "
      "decode step (break-even acceptance %.0f%%)",
      first.batch, first.speculative_s / first.decode_s, 100.0 * policy.break_even_acceptance);
  if (paying == 0) {
    policy.reason +=
        format("; predicted %.2fx at %.0f%% acceptance: off", first.speedup(prior), 100.0 * prior);
    return policy;
  }
  for (size_t i = paying; i < costs.size(); ++i) {
    const double idle = costs[i].idle_overhead();
    if (idle > options.max_idle_overhead) {
      policy.reason += format(
          "; drafting pays up to batch %d, but the MTP layer alone costs %.0f%% at batch %d: off",
          costs[paying - 1].batch, 100.0 * idle, costs[i].batch);
      return policy;
    }
  }
  policy.enabled = true;
  policy.max_running = costs[paying - 1].batch;
  policy.reason += format(
      "; drafting while at most %d sequences run (predicted %.2fx at %.0f%% "
      "acceptance)",
      policy.max_running, first.speedup(prior), 100.0 * prior);
  return policy;
}

}  // namespace peerserve
