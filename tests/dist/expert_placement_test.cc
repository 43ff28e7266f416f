#include "dist/expert_placement.h"

#include <gtest/gtest.h>

#include <string>

namespace peerserve::dist {
namespace {

TEST(ExpertPlacement, ContiguousShardsExpertsOverRanks) {
  auto placement = ExpertPlacement::contiguous({1, 2, 4}, 8, 4);
  ASSERT_TRUE(placement.ok()) << placement.status().to_string();
  EXPECT_EQ(placement->slots_per_rank(), 2);
  EXPECT_FALSE(placement->has_layer(0));
  EXPECT_FALSE(placement->has_layer(3));
  EXPECT_FALSE(placement->has_layer(99));
  EXPECT_TRUE(placement->has_layer(4));
  auto local = placement->local_experts(2, 3);
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0], 6);
  EXPECT_EQ(local[1], 7);
  auto copies = placement->copies(1, 5);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].rank, 2);
  EXPECT_EQ(copies[0].local_slot, 1);
  EXPECT_FALSE(placement->layer_copies(1).replicated);
}

TEST(ExpertPlacement, EpThatDoesNotDivideTheExpertsIsAClearError) {
  auto placement = ExpertPlacement::contiguous({1}, 64, 3);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(placement.status().message().find("--ep 3 does not divide the 64 routed experts"),
            std::string::npos)
      << placement.status().message();
}

TEST(ExpertPlacement, RedundantCopiesAreListedWithTheirRanks) {
  plan::ExpertLayout layout;
  layout.num_experts = 4;
  layout.num_ranks = 2;
  layout.slots_per_rank = 3;
  layout.physical_to_logical = {{0, 1, 3, 2, 3, 0}};
  auto placement = ExpertPlacement::create(layout, {5});
  ASSERT_TRUE(placement.ok()) << placement.status().to_string();
  auto copies = placement->copies(5, 3);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].rank, 0);
  EXPECT_EQ(copies[0].local_slot, 2);
  EXPECT_EQ(copies[1].rank, 1);
  EXPECT_EQ(copies[1].local_slot, 1);
  EXPECT_EQ(placement->copies(5, 1).size(), 1u);
  // The hot-loop view lists the same copies.
  const ExpertPlacement::LayerCopies layer = placement->layer_copies(5);
  EXPECT_TRUE(layer.replicated);
  ASSERT_EQ(layer.begin[4] - layer.begin[3], 2);
  EXPECT_EQ(layer.copies[layer.begin[3] + 1].rank, 1);
  EXPECT_EQ(layer.copies[layer.begin[3] + 1].local_slot, 1);
}

TEST(ExpertPlacement, InvalidLayoutsAreRejected) {
  plan::ExpertLayout layout;
  layout.num_experts = 4;
  layout.num_ranks = 2;
  layout.slots_per_rank = 2;
  layout.physical_to_logical = {{0, 1, 2, 2}};  // expert 3 nowhere
  EXPECT_FALSE(ExpertPlacement::create(layout, {1}).ok());
  layout.physical_to_logical = {{0, 1, 2, 3}};
  EXPECT_FALSE(ExpertPlacement::create(layout, {1, 2}).ok());  // rows vs layers
  layout.physical_to_logical = {{0, 1, 2, 3}, {0, 1, 2, 3}};
  EXPECT_FALSE(ExpertPlacement::create(layout, {1, 1}).ok());  // layer twice
}

TEST(ExpertPlacement, BalancedGivesTheHotExpertACopyAndLowersTheMaxLoad) {
  plan::ExpertRoutingLoad load;
  load.num_experts = 8;
  load.moe_layers = {1};
  load.counts = {{100, 5, 5, 5, 5, 5, 5, 5}};
  auto balanced = ExpertPlacement::balanced(load, 2, 2);
  ASSERT_TRUE(balanced.ok()) << balanced.status().to_string();
  EXPECT_EQ(balanced->slots_per_rank(), 5);
  EXPECT_GE(balanced->copies(1, 0).size(), 2u);
  auto uneven = ExpertPlacement::balanced(load, 4, 1);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("--ep 4"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::dist
