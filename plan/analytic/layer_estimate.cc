#include "plan/analytic/layer_estimate.h"

#include <cmath>

namespace peerserve::plan {

StreamTotals stream_totals(const std::vector<OperatorTime>& operators) {
  StreamTotals totals;
  for (const auto& op : operators) {
    if (op.communication) {
      totals.communication += op.seconds;
    } else if (op.stream == OperatorStream::kAttention) {
      totals.attention += op.seconds;
    } else {
      totals.moe += op.seconds;
    }
  }
  return totals;
}

PipelinePeriod two_stream_period(const StreamTotals& half) {
  const double a = half.attention;
  const double m = half.moe;
  const double x = half.communication;
  PipelinePeriod p;
  if (a <= 0.0) {  // nothing to overlap the MoE stream with
    p.period_s = m + x;
    p.attention_share = 0.0;
    return p;
  }
  if (x <= 0.0) {
    p.attention_share = a / (a + m);
  } else {
    // A / s = M / (1 - s) + X  <=>  X s^2 - (A + M + X) s + A = 0; the root in (0, 1).
    const double b = a + m + x;
    p.attention_share = (b - std::sqrt(b * b - 4.0 * x * a)) / (2.0 * x);
  }
  p.period_s = a / p.attention_share;
  return p;
}

}  // namespace peerserve::plan
