// The deployments the papers report on, as named presets (`peerserve plan --preset ...` and
// the reproduction report use the same values).
//   cloudmatrix-decode   paper 000 §4.1/§5.1: one decode instance of 320 dies, EP320, one
//                        expert per die (32 shared-expert dies, 256 routed + 32 redundant),
//                        INT8 weights, BF16 attention and KV, INT8 dispatch with 512 B of
//                        scales per token, BF16 combine, two microbatches, MTP 1 x 70%
//   cloudmatrix-prefill  16 NPUs = 32 dies, EP32, 10 experts per die (1 shared + 8 routed +
//                        1 redundant), SP-TP-SP attention (TP 4 as in Fig. 17), 16K tokens
//                        per NPU
//   deepseek-h800-decode paper 000 §3.5.1: EP144, 2 routed + 1 shared per GPU (32 redundant),
//                        FP8 weights and dispatch (224 B of scales: 56 x FP32), BF16 combine
//   deepseek-h800-prefill EP32 over 4 nodes, 9 routed (incl. redundant) + 1 shared per GPU,
//                        data-parallel attention, per-node deduplicated dispatch, 16K tokens
//   sglang-h100-decode   EP72 over 9 nodes, 4 routed (incl. redundant) + 1 shared per GPU,
//                        MTP 1 x 70% (simulated in paper 000 Table 4)
//   sglang-h100-prefill  as deepseek-h800-prefill
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/analytic/deployment.h"

namespace peerserve::plan {

std::vector<std::string> decode_preset_names();
std::vector<std::string> prefill_preset_names();
Result<DecodeDeployment> decode_preset(std::string_view name);
Result<PrefillDeployment> prefill_preset(std::string_view name);

}  // namespace peerserve::plan
