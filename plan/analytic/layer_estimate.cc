#include "plan/analytic/layer_estimate.h"

#include <algorithm>

namespace peerserve::plan {

double OperatorTime::seconds(double core_share) const {
  return fixed_s + std::max(link_s, compute_s / core_share);
}

double stream_seconds(const std::vector<OperatorTime>& operators, OperatorStream stream,
                      double core_share) {
  double total = 0.0;
  for (const auto& op : operators) {
    if (op.stream == stream) total += op.seconds(core_share);
  }
  return total;
}

double sequential_seconds(const std::vector<OperatorTime>& operators) {
  double total = 0.0;
  for (const auto& op : operators) total += op.seconds(1.0);
  return total;
}

PipelinePeriod two_stream_period(const std::vector<OperatorTime>& ops) {
  auto attention = [&](double s) { return stream_seconds(ops, OperatorStream::kAttention, s); };
  auto moe = [&](double s) { return stream_seconds(ops, OperatorStream::kMoe, 1.0 - s); };
  PipelinePeriod p;
  bool has_attention = false;
  bool has_moe = false;
  for (const auto& op : ops) {
    (op.stream == OperatorStream::kAttention ? has_attention : has_moe) = true;
  }
  if (!has_moe) {
    p.period_s = attention(1.0);
    return p;
  }
  if (!has_attention) {
    p.attention_share = 0.0;
    p.period_s = stream_seconds(ops, OperatorStream::kMoe, 1.0);
    return p;
  }
  // attention(s) falls and moe(s) rises with s: bisect for the crossing, where
  // max(attention, moe) is smallest.
  double lo = 1e-6;
  double hi = 1.0 - 1e-6;
  for (int i = 0; i < 80; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (attention(mid) > moe(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  p.attention_share = 0.5 * (lo + hi);
  p.period_s = std::max(attention(p.attention_share), moe(p.attention_share));
  return p;
}

LayerEstimate layer_estimate(std::vector<OperatorTime> whole_batch,
                             const std::vector<OperatorTime>& one_microbatch, Microbatching mode,
                             PipelineKind pipeline) {
  LayerEstimate layer;
  layer.operators = std::move(whole_batch);
  layer.sequential_s = sequential_seconds(layer.operators);
  if (pipeline == PipelineKind::kPartitionedCores) {
    const PipelinePeriod period = two_stream_period(one_microbatch);
    layer.microbatched_s = 2.0 * period.period_s;
    layer.attention_share = period.attention_share;
  } else {
    double cores = 0.0;
    double transfers = 0.0;
    for (const auto& op : one_microbatch) {
      cores += op.compute_s;
      transfers += op.link_s + op.fixed_s;
    }
    layer.microbatched_s = 2.0 * std::max(cores, transfers);
    layer.attention_share = 1.0;
  }
  switch (mode) {
    case Microbatching::kOff:
      layer.microbatched = false;
      break;
    case Microbatching::kOn:
      layer.microbatched = true;
      break;
    case Microbatching::kAuto:
      layer.microbatched = layer.microbatched_s < layer.sequential_s;
      break;
  }
  layer.seconds = layer.microbatched ? layer.microbatched_s : layer.sequential_s;
  return layer;
}

}  // namespace peerserve::plan
