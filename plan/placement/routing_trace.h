// Expert-routing traces in the format published with paper 004 (HF dataset
// core12345/MoE_expert_selection_trace): one JSON file per request, a list of forward steps.
//   step 0 (prefill): {"0": null, "3": [[e1..ek], ...one row per prompt token...], ...}
//   step i >= 1 (decode): {"0": null, "3": [[e1..ek]], ...}  (exactly one row per MoE layer)
// Keys are decoder-layer indices as strings; null marks a dense layer (no router). Rows are
// the top-k expert ids of one token, treated as an unordered set.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve::plan {

struct RequestRouting {
  int num_decoder_layers = 0;   // keys "0".."num_decoder_layers-1" (dense ones are null)
  std::vector<int> moe_layers;  // decoder-layer indices that route, ascending
  int top_k = 0;
  int prefill_tokens = 0;
  int decode_steps = 0;
  // selections[m]: expert ids at MoE layer moe_layers[m] for every token, token-major:
  // prefill tokens first, then one token per decode step; (prefill + decode) × top_k ids.
  std::vector<std::vector<uint16_t>> selections;

  int num_tokens() const { return prefill_tokens + decode_steps; }
  std::span<const uint16_t> experts(int moe_layer_index, int token) const {
    return std::span<const uint16_t>(selections[moe_layer_index])
        .subspan(static_cast<size_t>(token) * top_k, top_k);
  }
};

struct RoutingTraceParseOptions {
  // Routed experts per MoE layer; ids must be below it. 0 = unknown (ids must fit 16 bits).
  int num_experts = 0;
};

// Parses one request's trace. Errors name the step, layer and row that broke the format and
// say what was expected (DataLoss for broken JSON, InvalidArgument for a wrong shape).
Result<RequestRouting> parse_routing_trace(std::string_view json_text,
                                           const RoutingTraceParseOptions& options = {});

// Writes `request` back in the published format (compact, layers in numeric order).
std::string routing_trace_to_json(const RequestRouting& request);

}  // namespace peerserve::plan
