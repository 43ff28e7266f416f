#include "runtime/microbatch_policy.h"

#include <algorithm>
#include <bit>

namespace peerserve {

int MicrobatchPolicy::bucket_of(int64_t tokens) {
  if (tokens <= 0) return 0;
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(static_cast<uint64_t>(tokens))));
}

bool MicrobatchPolicy::choose(const Bucket& b) {
  // Warm-up: the mode with fewer samples (one whole step first).
  if (b.whole.samples < kWarmupSamples || b.split.samples < kWarmupSamples) {
    return b.split.samples < b.whole.samples;
  }
  const bool faster_is_split = b.split.average < b.whole.average;
  const bool explore = b.steps() % kExploreEvery == kExploreEvery - 1;
  return explore ? !faster_is_split : faster_is_split;
}

uint64_t MicrobatchPolicy::plan() const {
  uint64_t bits = 0;
  // Bucket 1 (a step of one row) never splits: one microbatch would be empty on every rank,
  // so there is nothing to overlap and the split only costs (under --ep it also gives up
  // the tensor-parallel products, which run in whole steps).
  for (int b = 2; b < kBuckets; ++b) {
    if (choose(buckets_[static_cast<size_t>(b)])) bits |= uint64_t{1} << b;
  }
  return bits;
}

void MicrobatchPolicy::record(int64_t tokens, bool split, double seconds) {
  if (tokens <= 0 || !(seconds >= 0)) return;
  Bucket& b = buckets_[static_cast<size_t>(bucket_of(tokens))];
  Mode& m = split ? b.split : b.whole;
  const double per_token = seconds / static_cast<double>(tokens);
  if (m.samples < kWarmupSamples) {
    // Warm-up keeps the lowest time: a mode's first steps can pay one-time costs (the first
    // touch of buffers and weight slices) that an average started from them would carry
    // for many steps, e.g. choosing the slower mode for a whole short run.
    m.average = m.samples == 0 ? per_token : std::min(m.average, per_token);
  } else {
    m.average += kSmoothing * (per_token - m.average);
  }
  ++m.samples;
}

}  // namespace peerserve
