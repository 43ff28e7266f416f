// EPLB against its published example and against outputs of the reference implementation.
#include "plan/placement/eplb_placement.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace peerserve::plan {
namespace {

ExpertRoutingLoad load_of(const std::vector<std::vector<double>>& rows) {
  ExpertRoutingLoad load;
  load.num_experts = static_cast<int>(rows.front().size());
  load.counts = rows;
  for (size_t l = 0; l < rows.size(); ++l) load.moe_layers.push_back(static_cast<int>(l));
  return load;
}

TEST(EplbPacking, HandComputedCase) {
  // Longest first onto the lightest bin with room (3 per bin): 10->A, 9->B, 8->B (9 < 10),
  // 7->A (10 < 17), 1->A (17 = 17, first bin), 1->B (A full).
  const std::vector<double> weight{10, 9, 8, 7, 1, 1};
  const EplbPacking packing = eplb_balanced_packing(weight, 2);
  EXPECT_EQ(packing.pack, (std::vector<int>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(packing.rank_in_pack, (std::vector<int>{0, 0, 1, 1, 2, 2}));
}

TEST(EplbReplication, HandComputedCase) {
  // Copies go to the largest load per copy: 6 -> 3|3; then 3 (expert 0) ties 3 (expert 1):
  // the lower index wins.
  const std::vector<double> weight{6, 3, 2};
  const EplbReplication replicas = eplb_replicate_experts(weight, 5);
  EXPECT_EQ(replicas.physical_to_logical, (std::vector<int>{0, 1, 2, 0, 0}));
  EXPECT_EQ(replicas.replica_rank, (std::vector<int>{0, 0, 0, 1, 2}));
  EXPECT_EQ(replicas.logical_count, (std::vector<int>{3, 1, 1}));
}

TEST(EplbPlacement, ReproducesThePublishedExample) {
  // README of github.com/deepseek-ai/EPLB: 2 layers x 12 experts, 16 replicas, 4 groups,
  // 2 nodes, 8 GPUs.
  const auto load = load_of({{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                             {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}});
  auto placement = eplb_placement(
      load, {.num_physical_experts = 16, .num_groups = 4, .num_nodes = 2, .num_gpus = 8});
  ASSERT_TRUE(placement.ok()) << placement.status().to_string();
  EXPECT_EQ(placement->physical_to_logical[0],
            (std::vector<int>{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1}));
  EXPECT_EQ(placement->physical_to_logical[1],
            (std::vector<int>{7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}));
  EXPECT_EQ(placement->slots_per_rank, 2);
  EXPECT_TRUE(placement->validate().ok());
}

TEST(EplbPlacement, MatchesTheReferenceImplementation) {
  const char* root = std::getenv("PEERSERVE_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") +
                   "/tests/plan_placement/eplb_reference_cases.json");
  ASSERT_TRUE(in.good()) << "run through ctest (PEERSERVE_SOURCE_DIR)";
  const auto doc = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : doc.at("cases")) {
    const auto load = load_of(c.at("weight").get<std::vector<std::vector<double>>>());
    EplbOptions options{.num_physical_experts = c.at("num_replicas").get<int>(),
                        .num_groups = c.at("num_groups").get<int>(),
                        .num_nodes = c.at("num_nodes").get<int>(),
                        .num_gpus = c.at("num_gpus").get<int>()};
    auto placement = eplb_placement(load, options);
    ASSERT_TRUE(placement.ok()) << placement.status().to_string();
    const auto expected = c.at("physical_to_logical").get<std::vector<std::vector<int>>>();
    const auto counts = c.at("logical_count").get<std::vector<std::vector<int>>>();
    for (size_t l = 0; l < expected.size(); ++l) {
      EXPECT_EQ(placement->physical_to_logical[l], expected[l])
          << "case " << checked << " layer " << l;
      EXPECT_EQ(placement->replica_counts(static_cast<int>(l)), counts[l]);
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(EplbPlacement, PolicySelection) {
  // 3 groups on 2 nodes: the auto policy falls back to global; forcing hierarchical fails
  // with the divisibility rule spelled out.
  std::vector<double> row(24);
  for (int e = 0; e < 24; ++e) row[e] = 1 + (e * 7) % 24;
  const auto load = load_of({row});
  EplbOptions options{.num_physical_experts = 30, .num_groups = 3, .num_nodes = 2, .num_gpus = 6};
  auto global = eplb_placement(load, options);
  ASSERT_TRUE(global.ok());
  options.policy = EplbPolicy::kGlobal;
  EXPECT_EQ(eplb_placement(load, options)->physical_to_logical, global->physical_to_logical);
  options.policy = EplbPolicy::kHierarchical;
  auto hierarchical = eplb_placement(load, options);
  ASSERT_FALSE(hierarchical.ok());
  EXPECT_NE(hierarchical.status().message().find("groups by nodes"), std::string::npos);

  auto too_few = eplb_placement(load, {.num_physical_experts = 20, .num_gpus = 4});
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.status().message().find("physical >= experts"), std::string::npos);
  EXPECT_FALSE(eplb_placement(load, {.num_physical_experts = 30, .num_gpus = 4}).ok());
}

}  // namespace
}  // namespace peerserve::plan
