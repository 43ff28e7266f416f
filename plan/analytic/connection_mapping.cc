#include "plan/analytic/connection_mapping.h"

#include <string>

namespace peerserve::plan {
namespace {

Status validate(const ConnectionMappingOptions& o) {
  if (o.prefill_tp < 1 || o.decode_tp < 1 || o.decode_dp < 1) {
    return invalid_argument("connection mapping: prefill_tp, decode_tp and decode_dp must be >= 1");
  }
  if (o.prefill_tp % o.decode_tp != 0) {
    return invalid_argument("connection mapping: prefill_tp = " + std::to_string(o.prefill_tp) +
                            " is not a multiple of decode_tp = " + std::to_string(o.decode_tp));
  }
  const int ratio = o.prefill_tp / o.decode_tp;
  if (o.decode_dp % ratio != 0) {
    return invalid_argument(
        "connection mapping: decode_dp = " + std::to_string(o.decode_dp) +
        " is not a multiple of prefill_tp / decode_tp = " + std::to_string(ratio));
  }
  return ok_status();
}

}  // namespace

Result<int> prefill_source_rank(const ConnectionMappingOptions& o, int decode_tp_rank,
                                int decode_dp_rank) {
  PS_RETURN_IF_ERROR(validate(o));
  if (decode_tp_rank < 0 || decode_tp_rank >= o.decode_tp || decode_dp_rank < 0 ||
      decode_dp_rank >= o.decode_dp) {
    return invalid_argument(
        "connection mapping: decode rank (tp " + std::to_string(decode_tp_rank) + ", dp " +
        std::to_string(decode_dp_rank) + ") is outside tp [0, " + std::to_string(o.decode_tp) +
        "), dp [0, " + std::to_string(o.decode_dp) + ")");
  }
  const int ratio = o.prefill_tp / o.decode_tp;
  const int group_size = o.decode_dp / ratio;
  const int group_id = decode_dp_rank / group_size;
  return group_id * o.decode_tp + decode_tp_rank;
}

Result<ConnectionMapping> prefill_decode_connection_mapping(const ConnectionMappingOptions& o) {
  PS_RETURN_IF_ERROR(validate(o));
  ConnectionMapping mapping;
  mapping.source.assign(o.decode_dp, std::vector<int>(o.decode_tp, 0));
  mapping.load_per_prefill_rank.assign(o.prefill_tp, 0);
  for (int dp = 0; dp < o.decode_dp; ++dp) {
    for (int tp = 0; tp < o.decode_tp; ++tp) {
      PS_ASSIGN_OR_RETURN(const int source, prefill_source_rank(o, tp, dp));
      mapping.source[dp][tp] = source;
      ++mapping.load_per_prefill_rank[source];
    }
  }
  return mapping;
}

}  // namespace peerserve::plan
