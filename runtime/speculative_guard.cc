#include "runtime/speculative_guard.h"

#include <algorithm>
#include <cmath>

namespace peerserve {

SpeculativeGuard::SpeculativeGuard(int64_t final_drafts, double min_acceptance)
    : final_drafts_(final_drafts), min_acceptance_(min_acceptance) {
  for (int64_t n = kFirstCheckpoint; n < final_drafts_; n *= 2) ++num_checkpoints_;
}

bool SpeculativeGuard::record(int64_t verified, int64_t accepted) {
  verified_ += verified;
  accepted_ += accepted;
  if (final_drafts_ <= 0) return false;
  if (verified_ >= final_drafts_) {
    return static_cast<double>(accepted_) < min_acceptance_ * static_cast<double>(verified_);
  }
  if (verified_ < next_checkpoint_ || num_checkpoints_ == 0) return false;
  // One test per checkpoint passed, however many a large step jumped over (the union bound
  // counts tests made, and at most num_checkpoints_ are).
  while (next_checkpoint_ <= verified_) next_checkpoint_ *= 2;
  const double level = kEarlyFalseStop / num_checkpoints_;
  return binomial_cdf(accepted_, verified_, min_acceptance_) < level;
}

double binomial_cdf(int64_t k, int64_t n, double p) {
  if (k >= n) return 1.0;
  if (k < 0) return 0.0;
  p = std::clamp(p, 0.0, 1.0);
  if (p == 0.0) return 1.0;
  if (p == 1.0) return 0.0;
  // Terms in log space: C(n, i) p^i (1 - p)^(n - i) underflows term by term for large n.
  const double log_p = std::log(p);
  const double log_q = std::log1p(-p);
  const double log_n = std::lgamma(static_cast<double>(n) + 1.0);
  double sum = 0.0;
  for (int64_t i = 0; i <= k; ++i) {
    const double di = static_cast<double>(i);
    const double dn = static_cast<double>(n);
    sum += std::exp(log_n - std::lgamma(di + 1.0) - std::lgamma(dn - di + 1.0) + di * log_p +
                    (dn - di) * log_q);
  }
  return std::min(sum, 1.0);
}

}  // namespace peerserve
