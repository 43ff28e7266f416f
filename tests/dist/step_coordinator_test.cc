// The lock-step agreement of data-parallel ranks: every rank learns the same decision at
// every step, idle ranks step along while anyone has work, and a rank that never arrives
// is an error naming it, not a hang.
#include "dist/step_coordinator.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "dist/in_process_communicator.h"

namespace peerserve::dist {
namespace {

using std::chrono::milliseconds;

TEST(StepCoordinatorTest, EveryRankStepsWhileAnyRankHasWork) {
  constexpr int kRanks = 3;
  InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kRanks; ++r) comms.push_back(group.communicator(r));
  // Rank 0 works for steps 0..4, rank 2 only at loop iteration 6, rank 1 never.
  auto tokens_of = [](int rank, int iteration) -> int64_t {
    if (rank == 0) return iteration < 5 ? 3 : 0;
    if (rank == 2) return iteration == 6 ? 1 : 0;
    return 0;
  };
  std::vector<std::vector<StepAgreement>> seen(kRanks);
  std::vector<Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      StepCoordinator coordinator(comms[r].get(), milliseconds(5000));
      for (int iteration = 0; iteration < 9; ++iteration) {
        auto agreement = coordinator.agree(tokens_of(r, iteration), /*stop=*/iteration == 8);
        if (!agreement.ok()) {
          results[r] = agreement.status();
          return;
        }
        seen[r].push_back(*agreement);
      }
      results[r] = ok_status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].to_string();
    ASSERT_EQ(seen[r].size(), 9u);
    for (int i = 0; i < 9; ++i) {
      const StepAgreement& a = seen[r][i];
      const bool expected_step = i < 5 || i == 6;
      EXPECT_EQ(a.step, expected_step) << "rank " << r << " iteration " << i;
      EXPECT_EQ(a.tokens, i < 5 ? 3 : (i == 6 ? 1 : 0));
      EXPECT_EQ(a.ranks_with_work, expected_step ? 1 : 0);
      EXPECT_EQ(a.stop, i == 8);
      // Same step numbering everywhere: steps agreed before this one (0..4, then 5 at
      // iterations 5 and 6, 6 after the step of iteration 6).
      EXPECT_EQ(a.step_index, i < 5 ? i : (i <= 6 ? 5 : 6));
      EXPECT_EQ(a.step_index, seen[0][i].step_index);
    }
  }
}

TEST(StepCoordinatorTest, ARankThatNeverArrivesIsAnErrorNamingIt) {
  InProcessGroup group(2);
  auto comm0 = group.communicator(0);
  auto comm1 = group.communicator(1);  // never agrees
  StepCoordinator coordinator(comm0.get(), milliseconds(200));
  auto agreement = coordinator.agree(4);
  ASSERT_FALSE(agreement.ok());
  EXPECT_EQ(agreement.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(agreement.status().to_string().find("1"), std::string::npos)
      << agreement.status().to_string();
}

TEST(StepCoordinatorTest, MailReachesEveryRank) {
  constexpr int kRanks = 3;
  InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kRanks; ++r) comms.push_back(group.communicator(r));
  // Iteration 0: ranks 0 and 2 post letters of different lengths, rank 1 none.
  // Iteration 1: nobody posts.
  auto letter_of = [](int rank, int iteration) {
    std::vector<std::byte> bytes;
    if (iteration == 0 && rank != 1) {
      for (int i = 0; i < 3 + 5 * rank; ++i) bytes.push_back(std::byte(rank * 16 + i));
    }
    return bytes;
  };
  std::vector<std::vector<StepAgreement>> seen(kRanks);
  std::vector<Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      StepCoordinator coordinator(comms[r].get(), milliseconds(5000));
      for (int iteration = 0; iteration < 2; ++iteration) {
        auto agreement = coordinator.agree(r == 1 ? 2 : 0, false, letter_of(r, iteration));
        if (!agreement.ok()) {
          results[r] = agreement.status();
          return;
        }
        seen[r].push_back(*agreement);
      }
      results[r] = ok_status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].to_string();
    ASSERT_EQ(seen[r].size(), 2u);
    ASSERT_EQ(seen[r][0].mail.size(), static_cast<size_t>(kRanks));
    for (int from = 0; from < kRanks; ++from) {
      EXPECT_EQ(seen[r][0].mail[from], letter_of(from, 0)) << "rank " << r << " from " << from;
    }
    EXPECT_TRUE(seen[r][0].step);
    EXPECT_EQ(seen[r][0].tokens, 2);
    EXPECT_TRUE(seen[r][1].mail.empty());
  }
}

// Every rank receives rank 0's proposal (the microbatch plan every rank follows), whatever
// the others proposed.
TEST(StepCoordinatorTest, EveryRankGetsTheLeadersProposal) {
  constexpr int kRanks = 3;
  InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kRanks; ++r) comms.push_back(group.communicator(r));
  std::vector<std::vector<uint64_t>> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      StepCoordinator coordinator(comms[r].get(), milliseconds(5000));
      for (uint64_t i = 0; i < 3; ++i) {
        const uint64_t proposal = (i << 60) | (uint64_t{1} << (10 + r)) | 1;  // high bits too
        auto agreement = coordinator.agree(1, false, {}, proposal);
        if (agreement.ok()) seen[r].push_back(agreement->leader_proposal);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(seen[r].size(), 3u) << "rank " << r;
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(seen[r][i], (i << 60) | (uint64_t{1} << 10) | 1);
  }
}

TEST(StepCoordinatorTest, OversizedMailIsRefusedBeforeCommunicating) {
  InProcessGroup group(1);
  auto comm = group.communicator(0);
  StepCoordinator coordinator(comm.get(), milliseconds(1000));
  // A span that claims more than the limit (never read: the size check comes first).
  std::byte one{};
  std::span<const std::byte> huge(&one, StepCoordinator::kMaxMailBytes + 1);
  EXPECT_EQ(coordinator.agree(0, false, huge).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator.steps(), 0);
}

}  // namespace
}  // namespace peerserve::dist
