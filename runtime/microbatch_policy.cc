#include "runtime/microbatch_policy.h"

#include <algorithm>
#include <bit>

namespace peerserve {

int MicrobatchPolicy::bucket_of(int64_t tokens) {
  if (tokens <= 0) return 0;
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(static_cast<uint64_t>(tokens))));
}

double MicrobatchPolicy::Bucket::slope() const {
  double spread = 0, covariance = 0;
  for (const Mode* m : {&whole, &split}) {
    if (m->weight <= 0) continue;
    spread += m->row_spread();
    covariance += m->covariance();
  }
  // A mean squared spread under half a row² is rounding (every size the same), not a spread.
  if (spread > 0.5 * (whole.weight + split.weight)) return std::max(0.0, covariance / spread);
  // No sizes to fit from: time proportional to rows, from the mode with more weight.
  const Mode& m = whole.weight >= split.weight ? whole : split;
  return m.weight > 0 ? m.mean_seconds() / m.mean_rows() : 0.0;
}

double MicrobatchPolicy::predicted_seconds(int64_t tokens, bool split) const {
  const Bucket& b = bucket(bucket_of(tokens));
  const Mode& m = split ? b.split : b.whole;
  if (tokens <= 0 || m.weight <= 0) return 0;
  const double slope = b.slope();
  return m.intercept(slope) + slope * static_cast<double>(tokens);
}

bool MicrobatchPolicy::choose(const Bucket& b) {
  // Warm-up: the mode with fewer samples (one whole step first).
  if (b.whole.samples < kWarmupSamples || b.split.samples < kWarmupSamples) {
    return b.split.samples < b.whole.samples;
  }
  // Both predicted at one size: the intercepts t - slope n compare.
  const double slope = b.slope();
  const bool faster_is_split = b.split.intercept(slope) < b.whole.intercept(slope);
  const bool explore = b.steps() % kExploreEvery == kExploreEvery - 1;
  return explore ? !faster_is_split : faster_is_split;
}

uint64_t MicrobatchPolicy::plan() const {
  uint64_t bits = 0;
  // Bucket 1 (a step of one row) never splits: one microbatch would be empty on every rank,
  // so there is nothing to overlap and the split only costs (under --ep it also gives up
  // the tensor-parallel products, which run in whole steps).
  for (int b = 2; b < kBuckets; ++b) {
    if (choose(bucket(b))) bits |= uint64_t{1} << b;
  }
  return bits;
}

void MicrobatchPolicy::record(int64_t tokens, bool split, double seconds) {
  if (tokens <= 0 || !(seconds >= 0)) return;
  Bucket& b = buckets_[static_cast<size_t>(bucket_of(tokens))];
  Mode& m = split ? b.split : b.whole;
  ++m.samples;
  if (m.samples == 1) return;  // the first step of a mode in a bucket: one-time costs
  // Plain means through the warm-up, then a moving fit (older samples decay).
  if (m.samples > kWarmupSamples) {
    const double keep = 1.0 - kSmoothing;
    m.weight *= keep;
    m.rows *= keep;
    m.seconds *= keep;
    m.rows_rows *= keep;
    m.rows_seconds *= keep;
  }
  const double n = static_cast<double>(tokens);
  m.weight += 1;
  m.rows += n;
  m.seconds += seconds;
  m.rows_rows += n * n;
  m.rows_seconds += n * seconds;
}

}  // namespace peerserve
