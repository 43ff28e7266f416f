// The published routing-trace format: parsing, clear errors on malformed input, round trips,
// and per-phase expert loads.
#include "plan/placement/routing_trace.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {
namespace {

std::string read_source_file(const std::string& relative) {
  const char* root = std::getenv("PEERSERVE_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(RoutingTrace, ParsesTheCommittedSample) {
  const std::string text = read_source_file("data/traces/tiny_request.json");
  ASSERT_FALSE(text.empty()) << "run through ctest (PEERSERVE_SOURCE_DIR)";
  auto request = parse_routing_trace(text, {.num_experts = 8});
  ASSERT_TRUE(request.ok()) << request.status().to_string();
  EXPECT_EQ(request->num_decoder_layers, 3);
  EXPECT_EQ(request->moe_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(request->top_k, 2);
  EXPECT_EQ(request->prefill_tokens, 3);
  EXPECT_EQ(request->decode_steps, 2);
  // Layer 2 (MoE index 1), token 1 is the second prompt token: [6, 2]; token 4 is decode 2.
  EXPECT_EQ(std::vector<uint16_t>(request->experts(1, 1).begin(), request->experts(1, 1).end()),
            (std::vector<uint16_t>{6, 2}));
  EXPECT_EQ(std::vector<uint16_t>(request->experts(1, 4).begin(), request->experts(1, 4).end()),
            (std::vector<uint16_t>{2, 6}));
}

TEST(RoutingTrace, ParsesTheCommittedSyntheticSample) {
  for (int i = 0; i < 4; ++i) {
    const std::string name = "data/traces/synthetic_skewed/" + std::to_string(i) + ".json";
    auto request = parse_routing_trace(read_source_file(name), {.num_experts = 64});
    ASSERT_TRUE(request.ok()) << name << ": " << request.status().to_string();
    EXPECT_EQ(request->moe_layers, (std::vector<int>{2, 3, 4, 5}));
    EXPECT_EQ(request->num_decoder_layers, 6);
    EXPECT_EQ(request->top_k, 4);
    EXPECT_EQ(request->decode_steps, 16);
    EXPECT_GE(request->prefill_tokens, 16);
    EXPECT_LE(request->prefill_tokens, 48);
  }
}

TEST(RoutingTrace, RoundTripsThroughTheWriter) {
  auto request = parse_routing_trace(read_source_file("data/traces/tiny_request.json"));
  ASSERT_TRUE(request.ok());
  const std::string json = routing_trace_to_json(*request);
  EXPECT_EQ(json.substr(0, 40), R"([{"0":null,"1":[[3,5],[1,3],[3,7]],"2":[)");
  auto again = parse_routing_trace(json);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->selections, request->selections);
  EXPECT_EQ(again->moe_layers, request->moe_layers);
  EXPECT_EQ(again->prefill_tokens, request->prefill_tokens);
  EXPECT_EQ(again->decode_steps, request->decode_steps);
}

struct MalformedCase {
  const char* json;
  const char* expected;  // a fragment of the error message
};

TEST(RoutingTrace, RejectsMalformedInputWithClearMessages) {
  const MalformedCase cases[] = {
      {R"([{"0": null, "1": [[1, 2]]})", "not valid JSON"},
      // A number that overflows a double threw out_of_range past the parse_error handler.
      {R"([{"1": [[1e400, 2]]}])", "not valid JSON"},
      {R"({"0": null})", "top level is a JSON object, expected an array of forward steps"},
      {"[]", "empty array, expected at least the prefill step"},
      {R"([[1, 2]])", "step 0 (prefill): expected an object keyed by decoder layer, got array"},
      {R"([{"x": [[1]]}])", "key 'x' is not a decoder layer index"},
      {R"([{"-1": [[1]]}])", "key '-1' is not a decoder layer index"},
      // A second spelling of a layer stood in for a missing one: its rows were short and the
      // load counts read past them.
      {R"([{"3": [[0, 1]], "4": [[2, 3]]}, {"3": [[0, 1]], "03": [[1, 2]]}])",
       "key '03' is not a decoder layer index"},
      {R"([{"-0": [[1]]}])", "key '-0' is not a decoder layer index"},
      {R"([{"0": null}])", "every layer is null"},
      {R"([{"1": "abc"}])",
       "layer 1: expected null (dense layer) or a list of top-k rows, got string"},
      {R"([{"1": []}])", "layer 1: no rows"},
      {R"([{"1": [[1, 2], [3]]}])", "layer 1, row 1: 1 expert ids, expected 2"},
      {R"([{"1": [[1, 1]]}])", "expert id 1 appears twice"},
      {R"([{"1": [[1, -2]]}])", "expert id -2 is not an integer in [0, 8)"},
      {R"([{"1": [[1, 9]]}])", "expert id 9 is not an integer in [0, 8)"},
      {R"([{"1": [[1, 2.5]]}])", "expert id 2.5 is not an integer"},
      {R"([{"1": [1, 2]}])", "row 0: expected a list of expert ids, got number"},
      {R"([{"1": [[1, 2]], "2": [[1, 2], [3, 4]]}])",
       "layer 2: 2 rows, but layer 1 has 1; every MoE layer of a step covers the same tokens"},
      {R"([{"1": [[1, 2]]}, {"1": [[1, 2], [3, 4]]}])",
       "step 1 (decode), layer 1: 2 rows, expected exactly 1"},
      {R"([{"1": [[1, 2]], "2": [[1, 2]]}, {"1": [[1, 2]]}])",
       "step 1 (decode), layer 2: missing, but the prefill step routes this layer"},
      {R"([{"1": [[1, 2]], "2": [[1, 2]]}, {"1": [[1, 2]], "2": null}])",
       "layer 2: null here, but the prefill step routes this layer"},
      {R"([{"0": null, "1": [[1, 2]]}, {"0": [[1, 2]], "1": [[1, 2]]}])",
       "layer 0: routes here, but the prefill step has this layer null or missing"},
      {R"([{"1": [[1, 2]]}, 3])", "step 1 (decode): expected an object"},
  };
  for (const MalformedCase& c : cases) {
    auto result = parse_routing_trace(c.json, {.num_experts = 8});
    ASSERT_FALSE(result.ok()) << c.json;
    EXPECT_NE(result.status().message().find(c.expected), std::string::npos)
        << c.json << "\n  got: " << result.status().message();
  }
  EXPECT_EQ(parse_routing_trace("[1,", {}).status().code(), StatusCode::kDataLoss);
}

TEST(ExpertRoutingLoad, CountsSelectionsPerPhase) {
  auto request = parse_routing_trace(read_source_file("data/traces/tiny_request.json"));
  ASSERT_TRUE(request.ok());
  const std::vector<RequestRouting> requests{*request, *request};
  auto prefill = expert_load_from_routing(requests, 8, RoutingPhase::kPrefill);
  ASSERT_TRUE(prefill.ok());
  // Layer 1 prefill rows [3,5],[1,3],[3,7], twice: expert 3 -> 6, experts 1, 5, 7 -> 2.
  EXPECT_EQ(prefill->counts[0], (std::vector<double>{0, 2, 0, 6, 0, 2, 0, 2}));
  auto decode = expert_load_from_routing(requests, 8, RoutingPhase::kDecode);
  ASSERT_TRUE(decode.ok());
  // Layer 2 decode rows [6,0],[2,6], twice.
  EXPECT_EQ(decode->counts[1], (std::vector<double>{2, 0, 2, 0, 0, 0, 4, 0}));
  auto all = expert_load_from_routing(requests, 8, RoutingPhase::kAll);
  ASSERT_TRUE(all.ok());
  for (int e = 0; e < 8; ++e) {
    EXPECT_EQ(all->counts[1][e], prefill->counts[1][e] + decode->counts[1][e]);
  }
  EXPECT_EQ(all->moe_layers, (std::vector<int>{1, 2}));

  auto too_few = expert_load_from_routing(requests, 4, RoutingPhase::kAll);
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.status().message().find(">= num_experts 4"), std::string::npos);
  RequestRouting other = *request;
  other.moe_layers = {1, 3};
  const std::vector<RequestRouting> mixed{*request, other};
  EXPECT_FALSE(expert_load_from_routing(mixed, 8, RoutingPhase::kAll).ok());

  const ExpertRoutingLoad scaled = scale_routing_load(*all, 100);
  double sum = 0;
  for (double v : scaled.counts[0]) sum += v;
  EXPECT_NEAR(sum, 100.0, 1e-9);
  EXPECT_NEAR(scaled.counts[0][3] / scaled.counts[0][1], all->counts[0][3] / all->counts[0][1],
              1e-12);
}

TEST(ExpertRoutingLoad, ParsesPhaseNames) {
  EXPECT_EQ(*parse_routing_phase("decode"), RoutingPhase::kDecode);
  EXPECT_FALSE(parse_routing_phase("both").ok());
}

}  // namespace
}  // namespace peerserve::plan
