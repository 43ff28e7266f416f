// Histogram: counts of observations in fixed buckets (cumulative upper bounds, as
// Prometheus histograms report them), plus their sum and count.
//
// Thread-safety: none; EngineMetrics guards its histograms with a mutex.
#pragma once

#include <cstdint>
#include <vector>

namespace peerserve {

class Histogram {
 public:
  // `upper_bounds` strictly increasing; an implicit +Inf bucket follows the last one.
  explicit Histogram(std::vector<double> upper_bounds);

  void observe(double value);

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Observations <= upper_bounds()[i] (cumulative), for each bound.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  // Per bucket, not cumulative; the last is +Inf.
  const std::vector<uint64_t>& bucket_counts() const { return bucket_counts_; }

  // Adds another histogram's observations (another engine's). False, and nothing added, when
  // its bounds differ.
  bool add(const Histogram& other);
  // Replaces the observations by per-bucket counts and their sum (a histogram carried from
  // another process). False, and nothing changed, when the bucket count differs.
  bool assign(const std::vector<uint64_t>& bucket_counts, double sum);

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> bucket_counts_;  // per bucket, not cumulative; last is +Inf
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

// Bucket bounds in seconds for request latencies (1 ms .. 10 min).
std::vector<double> latency_buckets_seconds();
// Bucket bounds in seconds for inter-token latencies (1 ms .. 20 s).
std::vector<double> inter_token_buckets_seconds();
// Bucket bounds for tokens emitted per speculative verification: 1, 2, ..., 9.
std::vector<double> acceptance_length_buckets();

}  // namespace peerserve
