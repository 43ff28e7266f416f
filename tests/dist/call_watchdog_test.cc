#include "dist/call_watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace peerserve::dist {
namespace {

using std::chrono::milliseconds;

TEST(CallWatchdogTest, CallsThatReturnInTimeAreLeftAlone) {
  CallWatchdog watchdog("rank 0", milliseconds(5));
  for (int i = 0; i < 20; ++i) {
    const CallWatchdog::Guard guard = watchdog.guard("MPI_Win_flush", 1, milliseconds(200));
    std::this_thread::sleep_for(milliseconds(1));
  }
  // Disarmed: waiting well past the last deadline ends nothing.
  std::this_thread::sleep_for(milliseconds(300));
  SUCCEED();
}

TEST(CallWatchdogDeathTest, AStuckCallEndsTheProcessNamingThePeer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CallWatchdog watchdog("rank 3", milliseconds(5));
        const CallWatchdog::Guard guard = watchdog.guard("MPI_Win_flush", 2, milliseconds(50));
        std::this_thread::sleep_for(std::chrono::seconds(30));  // stands for a blocked call
      },
      testing::ExitedWithCode(1),
      "rank 3: error: rank 2 did not complete MPI_Win_flush within 50 ms \\(lost\\?\\)");
}

}  // namespace
}  // namespace peerserve::dist
