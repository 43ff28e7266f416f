#include "plan/analytic/decode_bound.h"

namespace peerserve::plan {

DecodeBound decode_communication_bound(const DecodeBoundInputs& in) {
  DecodeBound b;
  b.bytes_per_layer = (in.dispatch_bytes_per_element + in.combine_bytes_per_element) *
                      in.tokens_per_device * in.fan_out * in.hidden_size;
  b.comm_s = in.bandwidth_gb_s > 0.0 ? b.bytes_per_layer / (in.bandwidth_gb_s * 1e9) : 0.0;
  b.layer_s = in.transfers_per_layer * b.comm_s;
  b.tpot_s = in.layers * b.layer_s;
  b.tokens_per_s = b.tpot_s > 0.0 ? 1.0 / b.tpot_s : 0.0;
  return b;
}

DecodeBoundInputs decode_bound_inputs(const ModelProfile& model, double tokens_per_device,
                                      double bandwidth_gb_s) {
  DecodeBoundInputs in;
  in.hidden_size = model.hidden_size;
  in.layers = model.num_layers;
  in.tokens_per_device = tokens_per_device;
  in.fan_out = model.experts_per_token + model.num_shared_experts;
  in.bandwidth_gb_s = bandwidth_gb_s;
  return in;
}

}  // namespace peerserve::plan
