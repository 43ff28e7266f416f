#include "runtime/histogram.h"

#include <algorithm>

#include "base/check.h"

namespace peerserve {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {
  for (size_t i = 1; i < upper_bounds_.size(); ++i) {
    PS_CHECK(upper_bounds_[i - 1] < upper_bounds_[i]) << "histogram bounds must increase";
  }
}

void Histogram::observe(double value) {
  // First bucket whose upper bound is >= value (Prometheus buckets are "le").
  const size_t b = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  ++bucket_counts_[b];
  ++count_;
  sum_ += value;
}

bool Histogram::add(const Histogram& other) {
  if (other.upper_bounds_ != upper_bounds_) return false;
  for (size_t b = 0; b < bucket_counts_.size(); ++b) bucket_counts_[b] += other.bucket_counts_[b];
  count_ += other.count_;
  sum_ += other.sum_;
  return true;
}

bool Histogram::assign(const std::vector<uint64_t>& bucket_counts, double sum) {
  if (bucket_counts.size() != bucket_counts_.size()) return false;
  bucket_counts_ = bucket_counts;
  count_ = 0;
  for (uint64_t c : bucket_counts_) count_ += c;
  sum_ = sum;
  return true;
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(upper_bounds_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    running += bucket_counts_[i];
    out[i] = running;
  }
  return out;
}

std::vector<double> latency_buckets_seconds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}

std::vector<double> inter_token_buckets_seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
          0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,  20.0};
}

std::vector<double> acceptance_length_buckets() {
  std::vector<double> bounds;
  for (int i = 1; i <= 9; ++i) bounds.push_back(i);
  return bounds;
}

}  // namespace peerserve
