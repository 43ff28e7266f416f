// PS_CHECK: evaluates its condition once, does nothing when it holds, aborts with the
// condition and the streamed context when it does not, and nests unbraced under an `if`
// (the build's -Werror rejects a macro that leaves a dangling else there).
#include <gtest/gtest.h>

#include "base/check.h"

namespace peerserve {
namespace {

TEST(CheckTest, PassingCheckEvaluatesOnceAndContinues) {
  int evaluated = 0;
  PS_CHECK(++evaluated == 1) << "not printed";
  EXPECT_EQ(evaluated, 1);
  PS_CHECK_LT(evaluated, 2);
}

TEST(CheckTest, NestsUnbracedUnderIf) {
  int branch = 0;
  const bool take_first = branch == 0;
  if (take_first) PS_CHECK(branch == 0) << "first";  // an if/else macro: -Wdangling-else
  if (take_first)
    PS_CHECK(branch == 0) << "second";
  else
    branch = 2;
  EXPECT_EQ(branch, 0);
}

TEST(CheckDeathTest, FailingCheckAbortsWithConditionAndContext) {
  const int blocks = 3;
  EXPECT_DEATH(PS_CHECK(blocks == 4) << "while freeing", "blocks == 4.*while freeing");
  EXPECT_DEATH(PS_CHECK_EQ(blocks, 4) << "pool", "3 vs 4 pool");
}

}  // namespace
}  // namespace peerserve
