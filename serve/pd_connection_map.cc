#include "serve/pd_connection_map.h"

#include <string>

namespace peerserve {

Result<int> prefill_source_rank(const PdParallelLayout& layout, int decode_dp_rank,
                                int decode_tp_rank) {
  const std::string sizes = "prefill TP " + std::to_string(layout.prefill_tp_size) +
                            ", decode TP " + std::to_string(layout.decode_tp_size) +
                            ", decode DP " + std::to_string(layout.decode_dp_size);
  if (layout.prefill_tp_size < 1 || layout.decode_tp_size < 1 || layout.decode_dp_size < 1) {
    return invalid_argument("P/D connection mapping: " + sizes + ": sizes must be >= 1");
  }
  if (layout.prefill_tp_size % layout.decode_tp_size != 0) {
    return invalid_argument("P/D connection mapping: " + sizes +
                            ": the prefill TP size must be a multiple of the decode TP size");
  }
  const int ratio = layout.prefill_tp_size / layout.decode_tp_size;
  if (layout.decode_dp_size % ratio != 0) {
    return invalid_argument("P/D connection mapping: " + sizes + ": the decode DP size must be " +
                            "a multiple of prefill TP / decode TP = " + std::to_string(ratio));
  }
  if (decode_dp_rank < 0 || decode_dp_rank >= layout.decode_dp_size || decode_tp_rank < 0 ||
      decode_tp_rank >= layout.decode_tp_size) {
    return invalid_argument("P/D connection mapping: decode rank (DP " +
                            std::to_string(decode_dp_rank) + ", TP " +
                            std::to_string(decode_tp_rank) + ") is outside " + sizes);
  }
  const int group_size = layout.decode_dp_size / ratio;
  const int group_id = decode_dp_rank / group_size;
  return group_id * layout.decode_tp_size + decode_tp_rank;
}

}  // namespace peerserve
