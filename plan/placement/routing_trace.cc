#include "plan/placement/routing_trace.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>

namespace peerserve::plan {
namespace {

using Json = nlohmann::json;

std::string where(size_t step, int layer = -1, size_t row = SIZE_MAX) {
  std::string text =
      "routing trace: step " + std::to_string(step) + (step == 0 ? " (prefill)" : " (decode)");
  if (layer >= 0) text += ", layer " + std::to_string(layer);
  if (row != SIZE_MAX) text += ", row " + std::to_string(row);
  return text;
}

Result<int> parse_layer_key(std::string_view key, size_t step) {
  int layer = -1;
  const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), layer);
  // Only the canonical spelling: "03" or "-0" next to "3" or "0" would give one layer two
  // keys, and the layer counts of a step would no longer prove every layer has its rows.
  if (key.empty() || error != std::errc() || end != key.data() + key.size() || layer < 0 ||
      layer > 100000 || key != std::to_string(layer)) {
    return invalid_argument(where(step) + ": key '" + std::string(key) +
                            "' is not a decoder layer index (expected a non-negative integer "
                            "string without leading zeros, such as \"3\")");
  }
  return layer;
}

// Appends one row (top-k expert ids) to `out`; the first row seen fixes top_k.
Status parse_row(const Json& row, size_t step, int layer, size_t row_index, int max_expert,
                 int& top_k, std::vector<uint16_t>& out) {
  if (!row.is_array()) {
    return invalid_argument(where(step, layer, row_index) +
                            ": expected a list of expert ids, got " + row.type_name());
  }
  if (top_k == 0) {
    if (row.empty() || row.size() > 64) {
      return invalid_argument(where(step, layer, row_index) + ": " + std::to_string(row.size()) +
                              " expert ids, expected between 1 and 64 (the router's top-k)");
    }
    top_k = static_cast<int>(row.size());
  }
  if (row.size() != static_cast<size_t>(top_k)) {
    return invalid_argument(where(step, layer, row_index) + ": " + std::to_string(row.size()) +
                            " expert ids, expected " + std::to_string(top_k) +
                            " (the top-k of the first row)");
  }
  const size_t begin = out.size();
  for (const Json& id : row) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= max_expert) {
      return invalid_argument(where(step, layer, row_index) + ": expert id " + id.dump() +
                              " is not an integer in [0, " + std::to_string(max_expert) + ")");
    }
    const auto expert = static_cast<uint16_t>(id.get<int64_t>());
    if (std::find(out.begin() + static_cast<std::ptrdiff_t>(begin), out.end(), expert) !=
        out.end()) {
      return invalid_argument(where(step, layer, row_index) + ": expert id " +
                              std::to_string(expert) + " appears twice in one top-k row");
    }
    out.push_back(expert);
  }
  return ok_status();
}

}  // namespace

Result<RequestRouting> parse_routing_trace(std::string_view json_text,
                                           const RoutingTraceParseOptions& options) {
  if (options.num_experts < 0 || options.num_experts > 65536) {
    return invalid_argument("routing trace: num_experts = " + std::to_string(options.num_experts) +
                            ", expected 1..65536 (or 0 for unknown)");
  }
  const int max_expert = options.num_experts > 0 ? options.num_experts : 65536;
  Json steps;
  try {
    steps = Json::parse(json_text);
  } catch (const Json::exception& error) {  // parse_error, and out_of_range for 1e400
    return data_loss(std::string("routing trace: not valid JSON: ") + error.what());
  }
  if (!steps.is_array()) {
    return invalid_argument(std::string("routing trace: top level is a JSON ") + steps.type_name() +
                            ", expected an array of forward steps (prefill first, then one per "
                            "decode step)");
  }
  if (steps.empty()) {
    return invalid_argument("routing trace: empty array, expected at least the prefill step");
  }

  RequestRouting request;
  std::map<int, size_t> moe_index;  // decoder layer -> index into selections
  int max_layer = -1;
  for (size_t step = 0; step < steps.size(); ++step) {
    const Json& layers = steps[step];
    if (!layers.is_object()) {
      return invalid_argument(where(step) + ": expected an object keyed by decoder layer, got " +
                              layers.type_name());
    }
    size_t step_rows = SIZE_MAX;
    int first_moe_layer = -1;
    size_t moe_layers_seen = 0;
    for (const auto& [key, value] : layers.items()) {
      PS_ASSIGN_OR_RETURN(int layer, parse_layer_key(key, step));
      max_layer = std::max(max_layer, layer);
      if (value.is_null()) {
        if (step > 0 && moe_index.count(layer)) {
          return invalid_argument(where(step, layer) +
                                  ": null here, but the prefill step routes this layer");
        }
        continue;
      }
      if (!value.is_array()) {
        return invalid_argument(where(step, layer) +
                                ": expected null (dense layer) or a list of top-k rows, got " +
                                value.type_name());
      }
      if (step == 0) {
        moe_index.emplace(layer, 0);
      } else if (!moe_index.count(layer)) {
        return invalid_argument(where(step, layer) +
                                ": routes here, but the prefill step has this layer null or "
                                "missing");
      }
      if (step > 0 && value.size() != 1) {
        return invalid_argument(where(step, layer) + ": " + std::to_string(value.size()) +
                                " rows, expected exactly 1 (a decode step adds one token)");
      }
      if (value.empty()) {
        return invalid_argument(where(step, layer) + ": no rows, expected one per prompt token");
      }
      if (step_rows == SIZE_MAX) {
        step_rows = value.size();
        first_moe_layer = layer;
      } else if (value.size() != step_rows) {
        return invalid_argument(where(step, layer) + ": " + std::to_string(value.size()) +
                                " rows, but layer " + std::to_string(first_moe_layer) + " has " +
                                std::to_string(step_rows) +
                                "; every MoE layer of a step covers the same tokens");
      }
      ++moe_layers_seen;
    }
    if (step == 0) {
      if (moe_index.empty()) {
        return invalid_argument(where(step) +
                                ": every layer is null; expected at least one "
                                "MoE layer with top-k rows");
      }
      size_t index = 0;
      for (auto& [layer, slot] : moe_index) {
        slot = index++;
        request.moe_layers.push_back(layer);
      }
      request.selections.resize(moe_index.size());
      request.prefill_tokens = static_cast<int>(step_rows);
    } else if (moe_layers_seen != moe_index.size()) {
      for (int layer : request.moe_layers) {
        if (!layers.contains(std::to_string(layer))) {
          return invalid_argument(where(step, layer) +
                                  ": missing, but the prefill step routes this layer");
        }
      }
    }
    // Second pass: rows, now that the step's shape is known to be consistent.
    for (const auto& [key, value] : layers.items()) {
      if (value.is_null()) continue;
      const int layer = *parse_layer_key(key, step);
      std::vector<uint16_t>& out = request.selections[moe_index.at(layer)];
      for (size_t row = 0; row < value.size(); ++row) {
        PS_RETURN_IF_ERROR(parse_row(value[row], step, layer, row, max_expert, request.top_k, out));
      }
    }
  }
  request.decode_steps = static_cast<int>(steps.size()) - 1;
  request.num_decoder_layers = max_layer + 1;
  return request;
}

std::string routing_trace_to_json(const RequestRouting& request) {
  std::vector<int> moe_of_layer(static_cast<size_t>(request.num_decoder_layers), -1);
  for (size_t m = 0; m < request.moe_layers.size(); ++m) {
    moe_of_layer[static_cast<size_t>(request.moe_layers[m])] = static_cast<int>(m);
  }
  std::string out = "[";
  const auto append_rows = [&](int m, int first_token, int num_tokens) {
    out += '[';
    for (int t = first_token; t < first_token + num_tokens; ++t) {
      if (t > first_token) out += ',';
      out += '[';
      const auto experts = request.experts(m, t);
      for (size_t j = 0; j < experts.size(); ++j) {
        if (j > 0) out += ',';
        out += std::to_string(experts[j]);
      }
      out += ']';
    }
    out += ']';
  };
  for (int step = 0; step <= request.decode_steps; ++step) {
    if (step > 0) out += ',';
    out += '{';
    for (int layer = 0; layer < request.num_decoder_layers; ++layer) {
      if (layer > 0) out += ',';
      out += '"' + std::to_string(layer) + "\":";
      const int m = moe_of_layer[static_cast<size_t>(layer)];
      if (m < 0) {
        out += "null";
      } else if (step == 0) {
        append_rows(m, 0, request.prefill_tokens);
      } else {
        append_rows(m, request.prefill_tokens + step - 1, 1);
      }
    }
    out += '}';
  }
  out += ']';
  return out;
}

}  // namespace peerserve::plan
