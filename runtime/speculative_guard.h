// SpeculativeGuard: when `--speculative auto` drafts, turns speculation off for good once the
// drafts are seen to be accepted below break-even (runtime/speculative_policy.h), i.e. when
// drafting loses.
//
// The start-up calibration decides from costs and a prior acceptance; only the requests show
// the model's real one, and a useless MTP head (the mini preset's random one accepts ~0%)
// makes every drafting step cost ~1.5-2x a plain one for nothing. Two rules:
//
//   - final: once `final_drafts` drafts were verified, off if fewer than `min_acceptance` of
//     them were accepted (the point estimate);
//   - early: at 8, 16, 32, ... verified drafts (each checkpoint below `final_drafts` once),
//     off if so few were accepted that a head accepting at break-even would show that few
//     with probability below 1% / (number of checkpoints): P(Binomial(n, min_acceptance) <= k)
//     below that. By the union bound, a head at or above break-even is turned off early with
//     probability below 1%; a head that accepts nothing is off after 8 drafts at a break-even
//     of 66% (0.34^8 = 2e-4).
#pragma once

#include <cstdint>

namespace peerserve {

class SpeculativeGuard {
 public:
  static constexpr int64_t kFirstCheckpoint = 8;
  static constexpr double kEarlyFalseStop = 0.01;

  // final_drafts 0: no guard (record() never stops speculation).
  SpeculativeGuard(int64_t final_drafts, double min_acceptance);

  // Adds a step's verified and accepted drafts; true when speculation should stop now.
  bool record(int64_t verified, int64_t accepted);

  int64_t verified() const { return verified_; }
  int64_t accepted() const { return accepted_; }
  int num_checkpoints() const { return num_checkpoints_; }

 private:
  int64_t final_drafts_;
  double min_acceptance_;
  int num_checkpoints_ = 0;
  int64_t next_checkpoint_ = kFirstCheckpoint;
  int64_t verified_ = 0;
  int64_t accepted_ = 0;
};

// P(X <= k) for X ~ Binomial(n, p); p is clamped to [0, 1].
double binomial_cdf(int64_t k, int64_t n, double p);

}  // namespace peerserve
