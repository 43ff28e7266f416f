// Remap, Dup and the per-rank cost model: hand-computed cases and invariants on skewed loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "plan/placement/expert_layout.h"
#include "plan/placement/placement_report.h"
#include "plan/placement/placement_study.h"
#include "plan/placement/prefill_aware_placement.h"
#include "plan/placement/synthetic_routing.h"

namespace peerserve::plan {
namespace {

ExpertRoutingLoad load_of(const std::vector<std::vector<double>>& rows) {
  ExpertRoutingLoad load;
  load.num_experts = static_cast<int>(rows.front().size());
  load.counts = rows;
  for (size_t l = 0; l < rows.size(); ++l) load.moe_layers.push_back(3 + static_cast<int>(l));
  return load;
}

TEST(ExpertLayout, ContiguousLayoutAndItsLoads) {
  auto layout = contiguous_layout(1, 4, 2);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->physical_to_logical[0], (std::vector<int>{0, 1, 2, 3}));
  auto evaluation = evaluate_placement(load_of({{10, 8, 1, 1}}), *layout, linear_expert_time(2.0));
  ASSERT_TRUE(evaluation.ok());
  EXPECT_EQ(evaluation->layers[0].rank_load, (std::vector<double>{18, 2}));
  EXPECT_DOUBLE_EQ(evaluation->layers[0].moe_time, 36.0);
  EXPECT_DOUBLE_EQ(evaluation->mean_max_over_mean, 18.0 / 10.0);
  auto bad = contiguous_layout(1, 5, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("divisible"), std::string::npos);
}

TEST(ExpertLayout, RooflineCostHasAWeightReadFloor) {
  // 1e9 FLOP per token at 1e12 FLOP/s = 1 ms per token; 1e9 weight bytes at 1e12 B/s = 1 ms.
  auto time = roofline_expert_time({.flops_per_token = 1e9,
                                    .weight_bytes = 1e9,
                                    .activation_bytes_per_token = 1e3,
                                    .peak_flops = 1e12,
                                    .memory_bandwidth = 1e12});
  ASSERT_TRUE(time.ok());
  EXPECT_DOUBLE_EQ((*time)(0), 0.0);
  EXPECT_NEAR((*time)(0.5), 1e-3 + 0.5e-9, 1e-15);  // memory-bound: weight read dominates
  EXPECT_NEAR((*time)(4), 4e-3, 1e-15);             // compute-bound
  EXPECT_FALSE(roofline_expert_time({}).ok());
}

TEST(ExpertLayout, ReplicasShareTheirExpertsLoad) {
  ExpertLayout layout;
  layout.num_experts = 3;
  layout.num_ranks = 2;
  layout.slots_per_rank = 2;
  layout.physical_to_logical = {{0, 1, 0, 2}};  // expert 0 on both ranks
  ASSERT_TRUE(layout.validate().ok());
  auto evaluation = evaluate_placement(load_of({{10, 4, 2}}), layout, linear_expert_time());
  ASSERT_TRUE(evaluation.ok());
  EXPECT_EQ(evaluation->layers[0].rank_load, (std::vector<double>{9, 7}));
  layout.physical_to_logical = {{0, 1, 0, 0}};
  auto invalid = layout.validate();
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.message().find("never places expert 2"), std::string::npos);
}

TEST(RemapPlacement, HandComputedCase) {
  // Loads 10, 8, 1, 1 on 2 ranks of 2: default puts 10+8 together (18 vs 2). Remap: 10->A,
  // 8->B, 1 (expert 2)->B (8 < 10), 1 (expert 3)->A (B full): 11 vs 9.
  auto layout = remap_placement(load_of({{10, 8, 1, 1}}), 2, linear_expert_time());
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->physical_to_logical[0], (std::vector<int>{0, 3, 1, 2}));
}

TEST(DupPlacement, HandComputedCase) {
  // Loads 10, 8, 1, 1; default A = {0, 1} (18), B = {2, 3} (2); one extra slot per rank.
  // Step 1: copying expert 0 to B gives A = 13, B = 7 (best; expert 1 gives 14).
  // Step 2: only A has room and it already holds 0 and 1; copying 2 or 3 there gives
  // A = 13.5, B = 6.5 either way, and the lower id wins. Algorithm 2 fills every slot.
  auto layout = dup_placement(load_of({{10, 8, 1, 1}}), 2, 1, linear_expert_time());
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_EQ(layout->physical_to_logical[0], (std::vector<int>{0, 1, 2, 2, 3, 0}));
  auto evaluation = evaluate_placement(load_of({{10, 8, 1, 1}}), *layout, linear_expert_time());
  ASSERT_TRUE(evaluation.ok());
  EXPECT_EQ(evaluation->layers[0].rank_load, (std::vector<double>{13.5, 6.5}));

  auto too_many = dup_placement(load_of({{10, 8, 1, 1}}), 2, 3, linear_expert_time());
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("expected 0..2"), std::string::npos);
}

// Ties between target ranks go to the lower rank (as the header says). Three experts of
// load 5 on three ranks, one extra slot each:
// step 1: every copy gives max 7.5 (a tie); expert 0 to the least-loaded rank with the lower
//         number, rank 1: loads 2.5, 7.5, 5;
// step 2: expert 1 to rank 0 gives 5, 5, 5 (expert 0 to rank 2 gives 6.67);
// step 3: only rank 2 has room; experts 0 and 1 tie at 6.67, the lower id goes.
// Before, ties went to the higher rank: { 0, 2, 1, 0, 2, 0 }.
TEST(DupPlacement, TiesGoToTheLowerRank) {
  auto layout = dup_placement(load_of({{5, 5, 5}}), 3, 1, linear_expert_time());
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_EQ(layout->physical_to_logical[0], (std::vector<int>{0, 1, 1, 0, 2, 0}));
}

class SkewedLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticRoutingOptions o;
    o.num_experts = 64;
    o.top_k = 4;
    o.num_dense_layers = 0;
    o.num_moe_layers = 4;
    o.num_requests = 8;
    o.min_prefill_tokens = 64;
    o.max_prefill_tokens = 64;
    o.decode_steps = 32;
    o.popularity_skew = 1.0;
    auto routing = generate_synthetic_routing(o);
    ASSERT_TRUE(routing.ok());
    auto load = expert_load_from_routing(routing->requests, 64, RoutingPhase::kAll);
    ASSERT_TRUE(load.ok());
    load_ = *load;
  }
  ExpertRoutingLoad load_;
};

TEST_F(SkewedLoad, EveryAlgorithmPlacesEveryExpertWithinItsBudgetAndImprovesBalance) {
  struct Case {
    PlacementAlgorithm algorithm;
    int redundant;
  };
  for (const Case c :
       {Case{PlacementAlgorithm::kEplbHierarchical, 1}, Case{PlacementAlgorithm::kEplbGlobal, 2},
        Case{PlacementAlgorithm::kRemap, 0}, Case{PlacementAlgorithm::kDup, 1}}) {
    PlacementOptions options{.algorithm = c.algorithm,
                             .num_ranks = 8,
                             .redundant_per_rank = c.redundant,
                             .num_groups = 4,
                             .num_nodes = 2};
    // Placed and evaluated on the same load: the balancers must not make it worse.
    auto study = run_placement_study(load_, load_, options, linear_expert_time());
    ASSERT_TRUE(study.ok()) << study.status().to_string();
    const ExpertLayout& after = study->after;
    ASSERT_TRUE(after.validate().ok()) << placement_algorithm_name(c.algorithm);
    EXPECT_EQ(after.num_slots(), 64 + 8 * c.redundant);
    for (int l = 0; l < after.num_layers(); ++l) {
      const auto counts = after.replica_counts(l);
      EXPECT_EQ(*std::min_element(counts.begin(), counts.end()), 1 - (c.redundant > 0 ? 0 : 0));
      int total = 0;
      for (int n : counts) total += n;
      EXPECT_EQ(total, 64 + 8 * c.redundant);
      if (c.algorithm == PlacementAlgorithm::kDup || c.algorithm == PlacementAlgorithm::kRemap) {
        // One copy of an expert per rank.
        for (int g = 0; g < 8; ++g) {
          const auto& slots = after.physical_to_logical[l];
          std::set<int> on_rank(slots.begin() + g * after.slots_per_rank,
                                slots.begin() + (g + 1) * after.slots_per_rank);
          EXPECT_EQ(static_cast<int>(on_rank.size()), after.slots_per_rank);
        }
      }
    }
    EXPECT_LT(study->after_evaluation.mean_max_over_mean,
              study->before_evaluation.mean_max_over_mean)
        << placement_algorithm_name(c.algorithm);
    EXPECT_LT(study->after_evaluation.moe_time, study->before_evaluation.moe_time);
    EXPECT_GT(study->speedup(), 1.0);
    const auto chart = placement_imbalance_chart(*study, load_.moe_layers);
    EXPECT_EQ(chart.max_over_mean_before.size(), 4u);
    EXPECT_EQ(chart.rank_load_after.size(), 8u);
  }
}

TEST_F(SkewedLoad, RejectsInconsistentOptions) {
  PlacementOptions options{
      .algorithm = PlacementAlgorithm::kRemap, .num_ranks = 8, .redundant_per_rank = 1};
  auto remap = place_experts(load_, options, linear_expert_time());
  ASSERT_FALSE(remap.ok());
  EXPECT_NE(remap.status().message().find("Remap keeps E/G experts per rank"), std::string::npos);
  options = {.algorithm = PlacementAlgorithm::kDup, .num_ranks = 7};
  EXPECT_NE(place_experts(load_, options, linear_expert_time()).status().message().find("dividing"),
            std::string::npos);
  EXPECT_EQ(*parse_placement_algorithm("eplb-global"), PlacementAlgorithm::kEplbGlobal);
  EXPECT_FALSE(parse_placement_algorithm("random").ok());
  ExpertRoutingLoad other = load_;
  other.moe_layers[0] = 99;
  EXPECT_FALSE(run_placement_study(load_, other, {}, linear_expert_time()).ok());
}

}  // namespace
}  // namespace peerserve::plan

namespace peerserve::plan {
namespace {

TEST(PlacementReport, ComparesTheDefaultLayoutWithEveryAlgorithm) {
  PlacementReportOptions options;
  options.routing.num_moe_layers = 4;  // the default scenario is 58 layers; keep the test quick
  options.routing.num_requests = 8;
  auto report = placement_report(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_FALSE(report->scenario.empty());
  ASSERT_EQ(report->entries.size(), 5u);
  EXPECT_EQ(report->entries[0].algorithm, "contiguous");
  EXPECT_DOUBLE_EQ(report->entries[0].speedup, 1.0);
  EXPECT_EQ(report->entries[0].slots_per_rank, 8);
  EXPECT_EQ(report->entries[4].algorithm, "dup");
  EXPECT_EQ(report->entries[4].slots_per_rank, 9);
  for (const auto& entry : report->entries) {
    EXPECT_EQ(entry.max_over_mean.size(), 4u);
    EXPECT_EQ(entry.rank_load.size(), 32u);
    EXPECT_GE(entry.worst_max_over_mean, entry.mean_max_over_mean);
  }
  // Placing from prefill routing must still help decode with a skewed, correlated workload.
  for (size_t i = 1; i < report->entries.size(); ++i) {
    EXPECT_GT(report->entries[i].speedup, 1.0) << report->entries[i].algorithm;
  }
}

}  // namespace
}  // namespace peerserve::plan
