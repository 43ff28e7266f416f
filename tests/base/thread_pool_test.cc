#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace peerserve {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      for (int64_t grain : {1, 8}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
            },
            grain);
        for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      }
    }
  }
}

TEST(ThreadPool, ManyShortJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 2000; ++i) {
    pool.parallel_for(4, [&](int64_t b, int64_t e) { sum += e - b; });
  }
  EXPECT_EQ(sum.load(), 8000);
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// Every part runs exactly once even when parts are claimed by whichever thread is free.
TEST(ThreadPool, RunOnAllRunsEveryPartOnce) {
  ThreadPool pool(3);
  for (int round = 0; round < 500; ++round) {
    std::vector<std::atomic<int>> hits(3);
    pool.run_on_all([&](int part, int parts) {
      ASSERT_EQ(parts, 3);
      hits[static_cast<size_t>(part)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

}  // namespace
}  // namespace peerserve
