#include "base/parallel_status.h"

#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace peerserve {
namespace {

TEST(ParallelForEachTest, RunsEveryItemOnceAndReturnsOkWhenAllSucceed) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> runs(101);
    const Status s = parallel_for_each(&pool, 101, [&](int64_t i) {
      runs[static_cast<size_t>(i)].fetch_add(1);
      return ok_status();
    });
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (const auto& r : runs) EXPECT_EQ(r.load(), 1) << threads << " threads";
  }
}

TEST(ParallelForEachTest, AnErrorIsReturnedAndTheOtherItemsStillRun) {
  ThreadPool pool(2);
  std::atomic<int> runs{0};
  const Status s = parallel_for_each(&pool, 50, [&](int64_t i) {
    runs.fetch_add(1);
    return i == 17 ? invalid_argument("item 17 is bad") : ok_status();
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "item 17 is bad");
  EXPECT_EQ(runs.load(), 50);
}

TEST(ParallelForEachTest, WithoutAPoolRunsInOrderAndKeepsTheFirstError) {
  std::vector<int64_t> order;
  const Status s = parallel_for_each(nullptr, 5, [&](int64_t i) {
    order.push_back(i);
    return i >= 2 ? invalid_argument("item " + std::to_string(i)) : ok_status();
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(s.message(), "item 2");
  EXPECT_TRUE(parallel_for_each(nullptr, 0, [](int64_t) { return ok_status(); }).ok());
}

// An item that throws (std::bad_alloc while weights are packed at load) is an error like any
// other, on a worker or on the calling thread (a throw on a worker ended the process).
TEST(ParallelForEachTest, AnItemThatThrowsIsAnError) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::atomic<int> runs{0};
    const Status s = parallel_for_each(&pool, 40, [&](int64_t i) -> Status {
      runs.fetch_add(1);
      if (i == 31) throw std::bad_alloc();
      return ok_status();
    });
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
    EXPECT_EQ(s.message(), "item 31: out of memory");
    EXPECT_EQ(runs.load(), 40);
  }
  const Status other = parallel_for_each(nullptr, 3, [](int64_t i) -> Status {
    if (i == 1) throw std::runtime_error("no");
    return ok_status();
  });
  EXPECT_EQ(other.code(), StatusCode::kInternal);
  EXPECT_EQ(other.message(), "item 1: no");
}

}  // namespace
}  // namespace peerserve
