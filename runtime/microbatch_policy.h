// When the two-microbatch pipeline splits a step: measured, per step size.
//
// Splitting pays only when there is waiting to hide (an expert exchange in flight while the
// other microbatch computes); it costs a second pass over the weights, which a
// bandwidth-bound decode step feels at once. Which wins depends on the machine, the
// transport and the batch, so the policy measures both: steps are grouped by size (bucket b
// holds steps of 2^(b-1) .. 2^b - 1 tokens), each bucket tries each mode a few times first,
// then runs the faster one and re-measures the other once every kExploreEvery steps of that
// bucket (costs drift as contexts grow). The slower mode thus runs on ~1/kExploreEvery of a
// bucket's steps after warm-up. A step of one row is never split: there is no second
// microbatch to overlap with.
//
// Comparing the modes: a bucket spans sizes up to 2x apart, and a decode step's time is
// mostly a fixed part (the weights) plus a part per row, so neither time per step nor time
// per token compares a mode measured mostly at 16 rows with one measured at 31 (comparing
// per token, the slower mode ran on 5-8% of the steps of a mix of 16-31 rows instead of
// ~1.6%). Each mode keeps a moving fit of step time t = a + b n; the slope b is shared by
// both modes (a split changes the fixed part: a second pass over the weights; a row costs
// the same) and fitted from the spread of sizes within each mode, and the modes are
// compared at the same size. Without such a spread the slope is taken as t / n (time
// proportional to rows). A mode's first step in a bucket is not counted: it can pay
// one-time costs (the first touch of buffers and weight slices) that would otherwise carry
// into its average for many steps.
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
  static constexpr double kSmoothing = 0.2;  // weight of a new sample once warmed up

  // The bucket of a step of `tokens` rows (0 for an empty step).
  static int bucket_of(int64_t tokens);

  // Bit b set: split the next step of bucket b.
  uint64_t plan() const;
  bool split(int64_t tokens) const { return (plan() >> bucket_of(tokens)) & 1; }

  // A step of `tokens` rows ran (split or not) in `seconds`.
  void record(int64_t tokens, bool split, double seconds);

  // Test and log support: a mode's predicted seconds for a step of `tokens` rows (0 before
  // it has a counted sample), and its number of samples (the uncounted first included).
  double predicted_seconds(int64_t tokens, bool split) const;
  int64_t samples(int bucket, bool split) const { return mode(bucket, split).samples; }

 private:
  // Moving moments of one mode's (rows, seconds) samples in one bucket.
  struct Mode {
    int64_t samples = 0;
    double weight = 0;  // the sums below are weighted; each sample adds 1 before decay
    double rows = 0, seconds = 0, rows_rows = 0, rows_seconds = 0;
    double mean_rows() const { return rows / weight; }
    double mean_seconds() const { return seconds / weight; }
    // Centred sums (spread of rows, covariance with seconds), times the weight.
    double row_spread() const { return rows_rows - rows * rows / weight; }
    double covariance() const { return rows_seconds - rows * seconds / weight; }
    // The fit's fixed part: the mean time less `slope` per mean row.
    double intercept(double slope) const { return mean_seconds() - slope * mean_rows(); }
  };
  struct Bucket {
    Mode whole, split;
    int64_t steps() const { return whole.samples + split.samples; }
    // Seconds per extra row, shared by both modes.
    double slope() const;
  };
  const Bucket& bucket(int b) const { return buckets_[static_cast<size_t>(b)]; }
  const Mode& mode(int b, bool split) const { return split ? bucket(b).split : bucket(b).whole; }
  static bool choose(const Bucket& b);

  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace peerserve
