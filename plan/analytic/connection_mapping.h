// Paper 000 §4.3.3: which prefill TP rank each decode rank pulls its KV cache from, so that
// the prefill->decode links are balanced. MLA keeps one latent per token, so every prefill TP
// rank holds the whole KV cache and any of them can serve any decode rank.
//   ratio      = prefill_tp / decode_tp
//   group_size = decode_dp / ratio
//   group_id   = floor(decode_dp_rank / group_size)
//   prefill_tp_rank = group_id x decode_tp + decode_tp_rank
#pragma once

#include <vector>

#include "base/status.h"

namespace peerserve::plan {

struct ConnectionMappingOptions {
  int prefill_tp = 1;
  int decode_tp = 1;
  int decode_dp = 1;
};

// InvalidArgument unless prefill_tp is a multiple of decode_tp and decode_dp a multiple of
// their ratio (the paper's scheme needs both), or when a rank is out of range.
Result<int> prefill_source_rank(const ConnectionMappingOptions& options, int decode_tp_rank,
                                int decode_dp_rank);

struct ConnectionMapping {
  // source[dp_rank][tp_rank]: the prefill TP rank that decode rank pulls from.
  std::vector<std::vector<int>> source;
  // Decode ranks served by each prefill TP rank.
  std::vector<int> load_per_prefill_rank;
};

Result<ConnectionMapping> prefill_decode_connection_mapping(
    const ConnectionMappingOptions& options);

}  // namespace peerserve::plan
