// Paper 002 §2.3.2: the communication-bound upper limit of decode speed when every device
// holds one expert and all compute hides under the EP all-to-all.
//   comm per layer  = (dispatch B + combine B) x tokens x fan-out x hidden / bandwidth
//   layer time      = transfers_per_layer x comm   (dual micro-batch overlap: 2)
//   TPOT            = layers x layer time
// The paper evaluates it with hidden = "7K" = 7000, 61 layers, 32 tokens per device,
// fan-out 9 (8 routed + 1 shared), FP8 dispatch (1 B) and BF16 combine (2 B): 120.96 us and
// 14.76 ms at 50 GB/s (400 Gb/s InfiniBand), 6.72 us and 0.82 ms at 900 GB/s (GB200 NVL72).
#pragma once

#include "plan/profiles/model_profile.h"

namespace peerserve::plan {

struct DecodeBoundInputs {
  double hidden_size = 0.0;
  int layers = 0;
  double tokens_per_device = 0.0;
  double fan_out = 0.0;  // experts per token, routed + shared
  double dispatch_bytes_per_element = 1.0;
  double combine_bytes_per_element = 2.0;
  double bandwidth_gb_s = 0.0;  // per device, one direction
  double transfers_per_layer = 2.0;
};

struct DecodeBound {
  double bytes_per_layer = 0.0;
  double comm_s = 0.0;
  double layer_s = 0.0;
  double tpot_s = 0.0;
  double tokens_per_s = 0.0;  // 1 / TPOT, per request
};

DecodeBound decode_communication_bound(const DecodeBoundInputs& inputs);

// The inputs for `model` (its hidden size, layers, top-k + shared experts).
DecodeBoundInputs decode_bound_inputs(const ModelProfile& model, double tokens_per_device,
                                      double bandwidth_gb_s);

}  // namespace peerserve::plan
