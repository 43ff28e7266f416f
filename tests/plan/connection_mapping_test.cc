// The §4.3.3 prefill -> decode connection mapping (plan/analytic/connection_mapping.h, also
// what `serve --role decode --ep N` uses) against the paper's formulas written out here, on
// every layout up to 16 ranks; every prefill rank gets the same number of decode ranks;
// layouts the formula does not cover are refused by name.
#include "plan/analytic/connection_mapping.h"

#include <gtest/gtest.h>

#include <map>

namespace peerserve::plan {
namespace {

TEST(ConnectionMapping, EveryLayoutFollowsThePaperAndBalances) {
  int layouts = 0;
  for (int ptp = 1; ptp <= 16; ++ptp) {
    for (int dtp = 1; dtp <= ptp; ++dtp) {
      if (ptp % dtp != 0) continue;
      for (int ddp = 1; ddp <= 16; ++ddp) {
        const int ratio = ptp / dtp;
        if (ddp % ratio != 0) continue;
        ++layouts;
        const ConnectionMappingOptions layout{ptp, dtp, ddp};
        std::map<int, int> load;
        for (int dp = 0; dp < ddp; ++dp) {
          for (int tp = 0; tp < dtp; ++tp) {
            auto rank = prefill_source_rank(layout, tp, dp);
            ASSERT_TRUE(rank.ok()) << rank.status().to_string();
            // ratio = P_tp / D_tp, group_size = D_dp / ratio, group_id = floor(dp / group_size),
            // prefill rank = group_id * D_tp + tp (paper 000 §4.3.3).
            const int group_size = ddp / ratio;
            EXPECT_EQ(*rank, (dp / group_size) * dtp + tp);
            ASSERT_GE(*rank, 0);
            ASSERT_LT(*rank, ptp);
            ++load[*rank];
          }
        }
        // Every prefill rank is used, each by the same number of decode ranks.
        ASSERT_EQ(static_cast<int>(load.size()), ptp) << ptp << " " << dtp << " " << ddp;
        for (const auto& [rank, n] : load) EXPECT_EQ(n, ddp * dtp / ptp);
      }
    }
  }
  EXPECT_GT(layouts, 50);
}

TEST(ConnectionMapping, ExampleLayouts) {
  // Prefill TP 16, decode TP 4 x DP 8: ratio 4, groups of 2 DP ranks.
  const ConnectionMappingOptions layout{16, 4, 8};
  EXPECT_EQ(*prefill_source_rank(layout, 0, 0), 0);
  EXPECT_EQ(*prefill_source_rank(layout, 3, 1), 3);
  EXPECT_EQ(*prefill_source_rank(layout, 0, 2), 4);
  EXPECT_EQ(*prefill_source_rank(layout, 3, 7), 15);
  // peerserve's case: decode --ep 2 (DP 2, TP 1) over two prefill instances.
  EXPECT_EQ(*prefill_source_rank({2, 1, 2}, 0, 0), 0);
  EXPECT_EQ(*prefill_source_rank({2, 1, 2}, 0, 1), 1);
}

TEST(ConnectionMapping, RefusesLayoutsOutsideTheFormula) {
  auto message = [](Result<int> r) { return r.ok() ? std::string() : r.status().message(); };
  EXPECT_NE(message(prefill_source_rank({6, 4, 8}, 0, 0)).find("not a multiple of decode_tp"),
            std::string::npos);
  EXPECT_NE(message(prefill_source_rank({4, 1, 2}, 0, 0))
                .find("not a multiple of prefill_tp / decode_tp"),
            std::string::npos);
  EXPECT_NE(message(prefill_source_rank({2, 1, 2}, 0, 2)).find("outside"), std::string::npos);
  EXPECT_NE(message(prefill_source_rank({2, 1, 2}, 1, 0)).find("outside"), std::string::npos);
  EXPECT_NE(message(prefill_source_rank({0, 1, 2}, 0, 0)).find(">= 1"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::plan
