// The deterministic prefill -> decode connection mapping of paper 000 §4.3.3, for prefill and
// decode instances with different parallel layouts. MLA keeps one latent KV per token, so
// every rank of a prefill TP group holds the whole KV of a request; if every decode rank
// pulled from the same prefill rank, that one link would carry all transfers. The mapping
// spreads decode ranks evenly over the prefill ranks:
//
//   ratio      = prefill_tp_size / decode_tp_size
//   group_size = decode_dp_size / ratio
//   group_id   = floor(decode_dp_rank / group_size)
//   prefill_tp_rank = group_id * decode_tp_size + decode_tp_rank
//
// peerserve's instances run without TP (attention is data-parallel), so a decode instance
// with `--ep N` has N DP ranks of TP 1 and its `--prefill` list plays the prefill group: each
// DP rank sends its prompts first to the prefill instance this mapping gives it
// (serve/prefill_dispatcher.h).
//
// Thread-safety: pure functions.
#pragma once

#include "base/status.h"

namespace peerserve {

struct PdParallelLayout {
  int prefill_tp_size = 1;
  int decode_tp_size = 1;
  int decode_dp_size = 1;
};

// The prefill TP rank decode rank (dp_rank, tp_rank) connects to. InvalidArgument naming
// the sizes when the formula does not apply: sizes < 1, prefill TP not a multiple of decode
// TP, decode DP not a multiple of the ratio, ranks out of range.
Result<int> prefill_source_rank(const PdParallelLayout& layout, int decode_dp_rank,
                                int decode_tp_rank);

}  // namespace peerserve
