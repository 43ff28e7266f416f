#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
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

// A part that throws, on the calling thread or on a worker: the loop waits for every other
// part, then rethrows the first exception; the pool goes on working. (A throw on the caller
// left early while workers still ran the job's freed captures, and the next loop could spin
// for ever; one on a worker ended the process.)
TEST(ThreadPool, APartThatThrowsIsRethrownAfterEveryPartFinished) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    const int thrower = round % 3;
    std::atomic<int> finished{0};
    try {
      pool.run_on_all([&](int part, int) {
        if (part == thrower) throw std::runtime_error("part " + std::to_string(part));
        std::this_thread::sleep_for(std::chrono::microseconds(round % 7 == 0 ? 200 : 0));
        finished.fetch_add(1);
      });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(e.what(), "part " + std::to_string(thrower));
    }
    EXPECT_EQ(finished.load(), 2) << "returned before the other parts finished";
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    EXPECT_EQ(sum.load(), 1000);
  }
}

TEST(ThreadPool, AGrainLargerThanTheRangeCoversIt) {
  ThreadPool pool(2);
  for (const int64_t grain : {int64_t{4}, std::numeric_limits<int64_t>::max(), int64_t{1} << 62}) {
    std::atomic<int64_t> covered{0};
    pool.parallel_for(
        3, [&](int64_t b, int64_t e) { covered.fetch_add(e - b); }, grain);
    EXPECT_EQ(covered.load(), 3) << "grain " << grain;
  }
}

// Pinned to one CPU, a default pool has one thread (it counted every online CPU).
TEST(ThreadPool, DefaultSizeFollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int cpus = available_cpus();
  const int threads = ThreadPool(0).num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(cpus, 1);
  EXPECT_EQ(threads, 1);
  EXPECT_EQ(available_cpus(), CPU_COUNT(&saved));
}

}  // namespace
}  // namespace peerserve
