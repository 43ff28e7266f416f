#include "kernels/cpu_features.h"

#include <gtest/gtest.h>

namespace peerserve::kernels {
namespace {

TEST(CpuFeatures, LevelsAreOrderedAndScalarAlwaysThere) {
  const std::vector<IsaLevel> levels = supported_isa_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), IsaLevel::kScalar);
  EXPECT_EQ(levels.back(), best_isa_level());
  for (size_t i = 1; i < levels.size(); ++i) EXPECT_LT(levels[i - 1], levels[i]);
  // Each level implies the ones below it.
  for (IsaLevel l : levels) {
    for (int below = 0; below < static_cast<int>(l); ++below) {
      EXPECT_TRUE(isa_level_supported(static_cast<IsaLevel>(below)));
    }
  }
}

TEST(CpuFeatures, FeaturesMatchLevels) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(isa_level_supported(IsaLevel::kAvx2), f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(isa_level_supported(IsaLevel::kAvx512Vnni),
            isa_level_supported(IsaLevel::kAvx512) && f.avx512_vnni);
  EXPECT_EQ(isa_level_supported(IsaLevel::kAvx512Bf16),
            isa_level_supported(IsaLevel::kAvx512Vnni) && f.avx512_bf16);
}

TEST(CpuFeatures, ForceAndReset) {
  EXPECT_EQ(active_isa_level(), best_isa_level());
  ASSERT_TRUE(force_isa_level(IsaLevel::kScalar).ok());
  EXPECT_EQ(active_isa_level(), IsaLevel::kScalar);
  {
    ScopedIsaLevel scoped(best_isa_level());
    EXPECT_EQ(active_isa_level(), best_isa_level());
  }
  EXPECT_EQ(active_isa_level(), IsaLevel::kScalar);
  reset_isa_level();
  EXPECT_EQ(active_isa_level(), best_isa_level());
}

TEST(CpuFeatures, ForcingAnUnsupportedLevelIsAnError) {
  for (IsaLevel l :
       {IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Vnni, IsaLevel::kAvx512Bf16}) {
    const Status status = force_isa_level(l);
    EXPECT_EQ(status.ok(), isa_level_supported(l));
    if (!status.ok()) {
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(status.message().find(std::string(isa_level_name(l))), std::string::npos);
    }
  }
  reset_isa_level();
}

TEST(CpuFeatures, Names) {
  EXPECT_EQ(isa_level_name(IsaLevel::kScalar), "scalar");
  EXPECT_EQ(isa_level_name(IsaLevel::kAvx2), "avx2");
  EXPECT_EQ(isa_level_name(IsaLevel::kAvx512), "avx512");
  EXPECT_EQ(isa_level_name(IsaLevel::kAvx512Vnni), "avx512_vnni");
  EXPECT_EQ(isa_level_name(IsaLevel::kAvx512Bf16), "avx512_bf16");
}

}  // namespace
}  // namespace peerserve::kernels
