// The per-expert load in Prometheus text: one counter family, a sample per expert of every
// layer that saw tokens, labelled with layer and expert.
#include <gtest/gtest.h>

#include "serve/prometheus_text.h"

namespace peerserve {
namespace {

TEST(ExpertLoadMetricsTest, LayersWithTokensGetOneSamplePerExpert) {
  // 3 layers x 2 experts; layer 0 (dense) saw nothing.
  const std::vector<int64_t> counts{0, 0, 5, 1, 0, 7};
  const std::string text = render_expert_load(counts, 2, "m");
  EXPECT_NE(text.find("# TYPE peerserve:moe_expert_tokens_total counter"), std::string::npos);
  EXPECT_NE(
      text.find("peerserve:moe_expert_tokens_total{model_name=\"m\",layer=\"1\",expert=\"0\"} 5"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("{model_name=\"m\",layer=\"1\",expert=\"1\"} 1"), std::string::npos);
  EXPECT_NE(text.find("{model_name=\"m\",layer=\"2\",expert=\"0\"} 0"), std::string::npos);
  EXPECT_NE(text.find("{model_name=\"m\",layer=\"2\",expert=\"1\"} 7"), std::string::npos);
  EXPECT_EQ(text.find("layer=\"0\""), std::string::npos);
  EXPECT_EQ(render_expert_load(counts, 0, "m"), "");
}

}  // namespace
}  // namespace peerserve
