// Time of one transformer layer from its operators, run back to back or as a two-microbatch
// pipeline.
//
// Pipeline model (paper 000 §4.2.3, Fig. 14): two streams, each handling one microbatch at a
// time: the attention stream (attention projections and core) and the MoE stream (gate,
// dispatch, experts, combine). The device's compute and memory bandwidth are split between
// the streams in the ratio that balances them (share s to attention, 1 - s to MoE); the
// transfers of dispatch and combine take link time but no compute. With A and M the
// attention and MoE compute times of one microbatch on the whole device and X its transfer
// time, the per-microbatch period p solves A / s = p = M / (1 - s) + X, and the layer takes
// 2p. Without microbatching the layer takes A + M + X at the full batch.
#pragma once

#include <string>
#include <vector>

namespace peerserve::plan {

enum class OperatorStream { kAttention, kMoe };

struct OperatorTime {
  std::string name;
  OperatorStream stream = OperatorStream::kAttention;
  bool communication = false;  // transfer time, overlappable with compute
  double seconds = 0.0;
};

struct StreamTotals {
  double attention = 0.0;      // compute on the attention stream
  double moe = 0.0;            // compute on the MoE stream
  double communication = 0.0;  // transfers (on the MoE stream's critical path)
  double sequential() const { return attention + moe + communication; }
};
StreamTotals stream_totals(const std::vector<OperatorTime>& operators);

// The balanced split for one microbatch whose streams take `half` on the whole device.
struct PipelinePeriod {
  double period_s = 0.0;         // per microbatch; the layer takes twice this
  double attention_share = 1.0;  // s
};
PipelinePeriod two_stream_period(const StreamTotals& half);

struct LayerEstimate {
  std::vector<OperatorTime> operators;  // the whole batch, all resources, back to back
  double sequential_s = 0.0;
  double microbatched_s = 0.0;
  double attention_share = 1.0;  // at the balanced split of the microbatched pipeline
  bool microbatched = false;     // which of the two `seconds` is
  double seconds = 0.0;
};

}  // namespace peerserve::plan
