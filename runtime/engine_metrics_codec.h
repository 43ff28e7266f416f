// One engine's metrics carried between processes, and summed: under --ep every rank runs its
// own engine, and rank 0's /metrics reports the group (counters, gauges and histograms added
// over the ranks, as a single engine holding all their requests would count them).
#pragma once

#include "base/byte_io.h"
#include "base/status.h"
#include "runtime/engine_metrics.h"

namespace peerserve {

void encode_engine_metrics(const EngineMetricsSnapshot& metrics, ByteWriter& out);
// DataLoss when the bytes are short, or a histogram has another number of buckets.
Result<EngineMetricsSnapshot> decode_engine_metrics(ByteReader& in);

// into += from: counts, totals, gauges and histograms summed; speculative decoding is active
// where any engine's is, and K is the larger.
void add_engine_metrics(EngineMetricsSnapshot& into, const EngineMetricsSnapshot& from);

}  // namespace peerserve
