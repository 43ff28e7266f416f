#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "dist/in_process_communicator.h"

namespace peerserve::dist {
namespace {

using std::chrono::milliseconds;

// Runs body(comm) on one thread per rank; returns each rank's Status.
std::vector<Status> run_ranks(int n, const std::function<Status(Communicator&)>& body) {
  InProcessGroup group(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(group.communicator(r));
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { results[r] = body(*comms[r]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(InProcessCommunicator, CollectivesCombineEveryRank) {
  auto results = run_ranks(4, [](Communicator& comm) -> Status {
    for (int round = 0; round < 20; ++round) {
      PS_RETURN_IF_ERROR(comm.barrier(milliseconds(5000)));
      std::vector<int64_t> sum = {comm.rank(), 10 * comm.rank() + round};
      PS_RETURN_IF_ERROR(comm.allreduce(sum, ReduceOp::kSum, milliseconds(5000)));
      if (sum[0] != 6 || sum[1] != 60 + 4 * round) return internal_error("sum wrong");
      std::vector<int64_t> max = {-comm.rank(), comm.rank() * 7};
      PS_RETURN_IF_ERROR(comm.allreduce(max, ReduceOp::kMax, milliseconds(5000)));
      if (max[0] != 0 || max[1] != 21) return internal_error("max wrong");
      const uint16_t mine = static_cast<uint16_t>(100 * comm.rank() + round);
      std::vector<uint16_t> all(comm.size());
      PS_RETURN_IF_ERROR(comm.allgather(std::as_bytes(std::span(&mine, 1)),
                                        std::as_writable_bytes(std::span(all)),
                                        milliseconds(5000)));
      for (int r = 0; r < comm.size(); ++r) {
        if (all[r] != 100 * r + round) return internal_error("allgather wrong");
      }
    }
    return ok_status();
  });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r].to_string();
}

TEST(InProcessCommunicator, PutThenSignalIsSeenByThePeer) {
  // Every rank writes a block and a flag into every rank's window, several rounds.
  constexpr size_t kBlock = 1000;
  auto results = run_ranks(3, [](Communicator& comm) -> Status {
    const int n = comm.size();
    PS_ASSIGN_OR_RETURN(auto window, comm.create_window(64 * n + kBlock * n, milliseconds(5000)));
    if (window->local().size() != 64 * n + kBlock * n) return internal_error("size");
    std::vector<std::byte> block(kBlock);
    for (uint64_t round = 1; round <= 30; ++round) {
      std::memset(block.data(), static_cast<int>(comm.rank() * 31 + round), kBlock);
      for (int target = 0; target < n; ++target) {
        PS_RETURN_IF_ERROR(window->put(target, 64 * n + kBlock * comm.rank(), block));
        PS_RETURN_IF_ERROR(window->signal(target, 64 * comm.rank(), round));
      }
      const auto deadline = Clock::now() + milliseconds(5000);
      for (int source = 0; source < n; ++source) {
        PS_RETURN_IF_ERROR(
            window->wait_at_least(64 * source, round, source, "test block", deadline));
        const std::byte expected = static_cast<std::byte>(source * 31 + round);
        std::span<const std::byte> got = window->local().subspan(64 * n + kBlock * source, kBlock);
        for (std::byte b : got) {
          if (b != expected) return internal_error("block from " + std::to_string(source));
        }
      }
      // Nobody overwrites a block before every rank has read this round's.
      PS_RETURN_IF_ERROR(comm.barrier(milliseconds(5000)));
    }
    return ok_status();
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r].to_string();
}

TEST(InProcessCommunicator, OutOfRangePutIsAnError) {
  auto results = run_ranks(2, [](Communicator& comm) -> Status {
    PS_ASSIGN_OR_RETURN(auto window, comm.create_window(128, milliseconds(5000)));
    std::vector<std::byte> bytes(16);
    Status past_end = window->put(1 - comm.rank(), 120, bytes);
    Status bad_rank = window->put(2, 0, bytes);
    Status misaligned = window->signal(0, 4, 1);
    if (past_end.ok() || bad_rank.ok() || misaligned.ok()) return internal_error("accepted");
    if (past_end.message().find("outside the window of 128 bytes") == std::string::npos ||
        bad_rank.message().find("rank 2 outside [0, 2)") == std::string::npos ||
        misaligned.message().find("not 8-byte aligned") == std::string::npos) {
      return internal_error(past_end.message() + " | " + bad_rank.message() + " | " +
                            misaligned.message());
    }
    return comm.barrier(milliseconds(5000));
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r].to_string();
}

TEST(InProcessCommunicator, MissingRankIsNamedWithinTheTimeout) {
  const auto start = Clock::now();
  auto results = run_ranks(4, [](Communicator& comm) -> Status {
    if (comm.rank() == 2) return ok_status();  // never joins
    return comm.barrier(milliseconds(2000));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));  // no hang (generous bound)
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(results[r].ok()) << r;
    EXPECT_EQ(results[r].code(), StatusCode::kUnavailable);
    EXPECT_NE(results[r].message().find("rank 2 did not arrive"), std::string::npos)
        << results[r].message();
  }
}

TEST(InProcessCommunicator, FlagThatNeverComesIsNamedAndBreaksTheGroup) {
  auto results = run_ranks(3, [](Communicator& comm) -> Status {
    PS_ASSIGN_OR_RETURN(auto window, comm.create_window(64 * 3, milliseconds(5000)));
    if (comm.rank() == 1) return ok_status();  // leaves without signalling
    for (int target = 0; target < 3; ++target) {
      PS_RETURN_IF_ERROR(window->signal(target, 64 * comm.rank(), 1));
    }
    const auto deadline = Clock::now() + milliseconds(2000);
    for (int source = 0; source < 3; ++source) {
      if (source == comm.rank()) continue;
      PS_RETURN_IF_ERROR(window->wait_at_least(64 * source, 1, source, "step 1", deadline));
    }
    return ok_status();
  });
  EXPECT_TRUE(results[1].ok());
  for (int r : {0, 2}) {
    ASSERT_FALSE(results[r].ok()) << r;
    EXPECT_NE(results[r].message().find("rank 1 did not deliver step 1"), std::string::npos)
        << results[r].message();
  }
}

}  // namespace
}  // namespace peerserve::dist
