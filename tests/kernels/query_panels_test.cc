// QueryPanels (decode attention scores over cached bf16 keys) against the definition
// evaluated in double, at every ISA level this CPU runs, with the packed product's error
// bound; plus row invariance and untouched padding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/query_panels.h"
#include "tests/kernels/kernel_test_support.h"

namespace peerserve::kernels {
namespace {

using testing::level_label;
using testing::levels_to_test;
using testing::Random;

struct Case {
  int64_t heads, width, tokens;
};

constexpr Case kCases[] = {{1, 2, 1},   {4, 80, 16},  {16, 288, 16}, {17, 288, 33},
                           {40, 64, 5}, {16, 576, 7}, {3, 1024, 16}, {32, 2048, 9}};

TEST(QueryPanels, ScoresEqualTheDefinitionWithinTheSumBound) {
  std::string levels = "[ isa ]";
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    levels += " " + std::string(isa_level_name(level));
    Random rng(17);
    for (const Case& c : kCases) {
      SCOPED_TRACE(level_label(level) + " heads=" + std::to_string(c.heads) +
                   " width=" + std::to_string(c.width) + " tokens=" + std::to_string(c.tokens));
      const int64_t q_stride = c.width + 5, key_stride = c.width + 6, scores_stride = c.heads + 3;
      const std::vector<float> q = rng.floats(static_cast<size_t>(c.heads * q_stride), -3, 3);
      const std::vector<bf16> keys = rng.bf16s(static_cast<size_t>(c.tokens * key_stride), -2, 2);
      constexpr float kUntouched = -12345.0f;
      std::vector<float> scores(static_cast<size_t>(c.tokens * scores_stride), kUntouched);
      QueryPanels panels;
      panels.pack(q.data(), q_stride, c.heads, c.width);
      panels.score(keys.data(), key_stride, c.tokens, scores.data(), scores_stride);
      for (int64_t j = 0; j < c.tokens; ++j) {
        for (int64_t h = 0; h < scores_stride; ++h) {
          const float got = scores[static_cast<size_t>(j * scores_stride + h)];
          if (h >= c.heads) {
            ASSERT_EQ(got, kUntouched) << "padding written at token " << j << " column " << h;
            continue;
          }
          double exact = 0.0, magnitude = 0.0;
          for (int64_t p = 0; p < c.width; ++p) {
            const double term =
                static_cast<double>(bf16_to_float(float_to_bf16(q[h * q_stride + p]))) *
                bf16_to_float(keys[static_cast<size_t>(j * key_stride + p)]);
            exact += term;
            magnitude += std::fabs(term);
          }
          const double bound = static_cast<double>(c.width + 2) * 0x1p-24 * magnitude;
          ASSERT_LE(std::fabs(got - exact), bound) << "token " << j << " head " << h;
        }
      }
    }
  }
  std::printf("%s (query panels: the packed bf16 product at each level)\n", levels.c_str());
}

// A key's scores do not depend on which other keys are scored with it (the decode attention
// scores a cache block at a time, and a sequence's blocks hold different numbers of keys).
TEST(QueryPanels, AKeysScoresAreBitwiseTheSameAloneAndInARun) {
  for (IsaLevel level : levels_to_test()) {
    ScopedIsaLevel isa(level);
    SCOPED_TRACE(level_label(level));
    Random rng(5);
    const int64_t heads = 20, width = 576, tokens = 16;
    const std::vector<float> q = rng.floats(static_cast<size_t>(heads * width));
    const std::vector<bf16> keys = rng.bf16s(static_cast<size_t>(tokens * width));
    QueryPanels panels;
    panels.pack(q.data(), width, heads, width);
    std::vector<float> run(static_cast<size_t>(tokens * heads));
    panels.score(keys.data(), width, tokens, run.data(), heads);
    for (int64_t j = 0; j < tokens; ++j) {
      std::vector<float> alone(static_cast<size_t>(heads));
      panels.score(keys.data() + j * width, width, 1, alone.data(), heads);
      for (int64_t h = 0; h < heads; ++h) {
        ASSERT_EQ(alone[static_cast<size_t>(h)], run[static_cast<size_t>(j * heads + h)])
            << "token " << j << " head " << h;
      }
    }
  }
}

// Packing again (other heads, other width) replaces the previous panels entirely.
TEST(QueryPanels, RepackingReplacesThePreviousQueries) {
  Random rng(9);
  const std::vector<float> wide = rng.floats(40 * 576);
  const std::vector<float> narrow = rng.floats(3 * 64);
  const std::vector<bf16> keys = rng.bf16s(64);
  QueryPanels reused, fresh;
  reused.pack(wide.data(), 576, 40, 576);
  reused.pack(narrow.data(), 64, 3, 64);
  fresh.pack(narrow.data(), 64, 3, 64);
  float a[3], b[3];
  reused.score(keys.data(), 64, 1, a, 3);
  fresh.score(keys.data(), 64, 1, b, 3);
  for (int h = 0; h < 3; ++h) EXPECT_EQ(a[h], b[h]) << "head " << h;
  EXPECT_EQ(reused.heads(), 3);
  EXPECT_EQ(reused.width(), 64);
}

}  // namespace
}  // namespace peerserve::kernels
