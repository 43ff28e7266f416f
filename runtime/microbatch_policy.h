// When the two-microbatch pipeline splits a step: measured, per step size.
//
// Splitting pays only when there is waiting to hide (an expert exchange in flight while the
// other microbatch computes); it costs a second pass over the weights, which a
// bandwidth-bound decode step feels at once. Which wins depends on the machine, the
// transport and the batch, so the policy measures both: steps are grouped by size (bucket b
// holds steps of 2^(b-1) .. 2^b - 1 tokens), each bucket tries each mode a few times first
// (keeping the lowest time per token of those, as first steps can pay one-time costs), then
// keeps a moving average of the time per token of each mode, runs the faster one and
// re-measures the other once every kExploreEvery steps of that bucket (costs drift as
// contexts grow). The slower mode thus runs on at most ~1/kExploreEvery of a
// bucket's steps after warm-up. A step of one row is never split: there is no second
// microbatch to overlap with.
//
// plan() returns the choice for every bucket as one bit mask, so that ranks in lock-step can
// all follow the leader's plan for the size the group agreed on (every rank must split the
// same steps, or their exchanges would not pair up).
//
// Thread-safety: one thread (the engine's).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace peerserve {

class MicrobatchPolicy {
 public:
  static constexpr int kBuckets = 32;
  static constexpr int kWarmupSamples = 3;   // per mode and bucket before choosing
  static constexpr int kExploreEvery = 64;   // steps of a bucket per run of the other mode
  static constexpr double kSmoothing = 0.2;  // weight of a new sample in the average

  // The bucket of a step of `tokens` rows (0 for an empty step).
  static int bucket_of(int64_t tokens);

  // Bit b set: split the next step of bucket b.
  uint64_t plan() const;
  bool split(int64_t tokens) const { return (plan() >> bucket_of(tokens)) & 1; }

  // A step of `tokens` rows ran (split or not) in `seconds`.
  void record(int64_t tokens, bool split, double seconds);

  // Test and log support: the average seconds per token of a mode in a bucket (0 when it
  // has no sample), and its number of samples.
  double seconds_per_token(int bucket, bool split) const { return mode(bucket, split).average; }
  int64_t samples(int bucket, bool split) const { return mode(bucket, split).samples; }

 private:
  struct Mode {
    double average = 0;
    int64_t samples = 0;
  };
  struct Bucket {
    Mode whole, split;
    int64_t steps() const { return whole.samples + split.samples; }
  };
  const Mode& mode(int bucket, bool split) const {
    return split ? buckets_[static_cast<size_t>(bucket)].split
                 : buckets_[static_cast<size_t>(bucket)].whole;
  }
  static bool choose(const Bucket& b);

  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace peerserve
