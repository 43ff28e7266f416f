// Time of one transformer layer from its operators, run back to back or as a two-microbatch
// pipeline.
//
// An operator has up to three parts: work on the device's cores (compute_s, which slows down
// when the operator gets only a share of the cores), a transfer on the interconnect (link_s,
// overlapping with the core work: dispatch pipelines packing one token with sending the
// previous ones, paper 000 §4.2.1), and a fixed latency (fixed_s). At a core share x it takes
// fixed_s + max(link_s, compute_s / x).
//
// Two pipelines of two microbatches (without microbatching the operators run back to back):
// - kPartitionedCores (decode, paper 000 §4.2.3, Fig. 14): two streams, each handling one
//   microbatch at a time: the attention stream (attention projections and core) and the MoE
//   stream (gate, dispatch, experts, combine). The cores are split between them, share s to
//   attention and 1 - s to MoE, in the ratio that balances the two; a layer takes twice the
//   balanced per-microbatch period.
// - kSharedCores (prefill, §4.3.2, Fig. 18): every computation of both microbatches shares
//   all cores while transfers run on copy engines underneath: a layer takes
//   max(all core work, all transfer and fixed time) of the two microbatches.
#pragma once

#include <string>
#include <vector>

#include "plan/analytic/deployment.h"

namespace peerserve::plan {

enum class OperatorStream { kAttention, kMoe };

struct OperatorTime {
  std::string name;
  OperatorStream stream = OperatorStream::kAttention;
  double compute_s = 0.0;
  double link_s = 0.0;
  double fixed_s = 0.0;

  double seconds(double core_share = 1.0) const;
  bool communication() const { return link_s > 0.0 || fixed_s > 0.0; }
};

// Sum over one stream's operators at a core share.
double stream_seconds(const std::vector<OperatorTime>& operators, OperatorStream stream,
                      double core_share);
// Every operator back to back with all cores.
double sequential_seconds(const std::vector<OperatorTime>& operators);

struct PipelinePeriod {
  double period_s = 0.0;         // per microbatch; the layer takes twice this
  double attention_share = 1.0;  // s
};
// The balanced split for the operators of one microbatch.
PipelinePeriod two_stream_period(const std::vector<OperatorTime>& microbatch_operators);

enum class PipelineKind { kPartitionedCores, kSharedCores };

struct LayerEstimate {
  std::vector<OperatorTime> operators;  // the whole batch, all cores, back to back
  double sequential_s = 0.0;
  double microbatched_s = 0.0;
  double attention_share = 1.0;  // at the balanced split of the microbatched pipeline
  bool microbatched = false;     // which of the two `seconds` is
  double seconds = 0.0;
};

// The layer from its operators over the whole batch and over one of two microbatches, with
// `mode` choosing between back to back and the pipeline (kAuto: the faster).
LayerEstimate layer_estimate(std::vector<OperatorTime> whole_batch,
                             const std::vector<OperatorTime>& one_microbatch, Microbatching mode,
                             PipelineKind pipeline);

}  // namespace peerserve::plan
