// SplitMlpBackend: the dense/shared-expert MLP split over N in-process ranks gives, on every
// rank, bitwise what the rank computes alone (the model's run_mlp: grouped gate/up, SiLU,
// down), for fp32 and bf16 activations and the packed BF16 weights; it declines alike on
// every rank when one brings too many rows, and declines INT8 MLPs without communicating.
#include "dist/split_mlp_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "dist/in_process_communicator.h"
#include "kernels/activation.h"
#include "kernels/matmul_packed_bf16.h"
#include "model/weight_packing.h"
#include "tests/dist/allocation_counter.h"
#include "tests/dist/random_moe.h"

namespace peerserve::dist {
namespace {

using testing::RandomMoe;

constexpr int64_t kHidden = 64, kInter = 96;
constexpr int kLayers = 3;

// One MLP per layer: expert 0 of a one-expert random MoE.
RandomMoe make_mlps(bool packed) {
  RandomMoe moe(kHidden, kInter, 1, 1, {0, 1, 2}, 17);
  if (packed) {
    for (int layer = 0; layer < kLayers; ++layer) {
      PS_CHECK(pack_mlp_bf16(moe.experts[layer][0]).ok());
    }
  }
  return moe;
}

// What one process computes (DeepseekModel's run_mlp for a BF16 MLP).
std::vector<float> local_mlp(const ComputeContext& ctx, const MlpWeights& w, const float* x,
                             int64_t rows) {
  std::vector<float> gate(rows * kInter), up(rows * kInter), out(rows * kHidden);
  const LinearProblem problems[2] = {{.x = x, .w = &w.gate, .y = gate.data(), .m = rows},
                                     {.x = x, .w = &w.up, .y = up.data(), .m = rows}};
  grouped_bf16_linear(ctx, problems);
  kernels::silu_mul(gate.data(), up.data(), gate.data(), rows * kInter);
  linear(ctx, gate.data(), rows, w.down, out.data());
  return out;
}

std::vector<float> random_rows(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * kHidden);
  for (float& v : x) v = normal(rng);
  return x;
}

struct Case {
  int ranks = 2;
  kernels::ActivationPrecision precision = kernels::ActivationPrecision::kFp32;
  bool packed = false;
  int max_rows = 8;
  int calls = 9;
  std::function<int64_t(int rank, int call)> rows_of;
};

// Runs the calls on every rank; returns the number of calls each rank saw split.
std::vector<int64_t> run_case(const Case& c) {
  const RandomMoe moe = make_mlps(c.packed);
  InProcessGroup group(c.ranks);
  std::vector<int64_t> splits(c.ranks, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < c.ranks; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      SplitMlpBackendOptions options;
      options.communicator = comm.get();
      for (int layer = 0; layer < kLayers; ++layer) {
        options.mlps_by_layer.push_back(&moe.experts[layer][0]);
      }
      options.hidden_size = kHidden;
      options.max_rows_per_rank = c.max_rows;
      options.peer_timeout = std::chrono::milliseconds(20000);
      auto backend = SplitMlpBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      const ComputeContext ctx{.pool = nullptr, .precision = c.precision};
      for (int call = 0; call < c.calls; ++call) {
        const int layer = call % kLayers;
        const int64_t rows = c.rows_of(rank, call);
        bool all_fit = c.max_rows > 0;
        for (int r = 0; r < c.ranks; ++r) all_fit = all_fit && c.rows_of(r, call) <= c.max_rows;
        const std::vector<float> x = random_rows(rows, 1000 * rank + call);
        std::vector<float> out(rows * kHidden, -7.0f);
        Result<bool> done = (*backend)->run(ctx, layer, x.data(), rows, out.data());
        ASSERT_TRUE(done.ok()) << done.status().to_string();
        EXPECT_EQ(*done, all_fit) << "rank " << rank << " call " << call;
        if (!*done) {
          for (float v : out) ASSERT_EQ(v, -7.0f) << "a declined call wrote its output";
          continue;
        }
        const std::vector<float> want = local_mlp(ctx, moe.experts[layer][0], x.data(), rows);
        ASSERT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0)
            << "rank " << rank << " call " << call << " (" << rows << " rows) differs";
      }
      splits[rank] = (*backend)->split_calls();
    });
  }
  for (std::thread& t : threads) t.join();
  return splits;
}

// Uneven rows, idle ranks, and every few calls one rank over the limit.
int64_t uneven_rows(int rank, int call) {
  if (call % 4 == 3 && rank == 1) return 11;
  return (rank * 5 + call * 3) % 9 == 0 ? 0 : (rank * 5 + call * 3) % 9;
}

TEST(SplitMlpBackendTest, Fp32TwoRanksEqualsOneProcess) {
  const std::vector<int64_t> splits = run_case({.ranks = 2, .rows_of = uneven_rows});
  EXPECT_EQ(splits, (std::vector<int64_t>{7, 7}));  // calls 3 and 7 had 11 rows on rank 1
}

TEST(SplitMlpBackendTest, Fp32FourRanksEqualsOneProcess) {
  const std::vector<int64_t> splits = run_case({.ranks = 4, .rows_of = uneven_rows});
  EXPECT_EQ(splits, (std::vector<int64_t>(4, 7)));
}

TEST(SplitMlpBackendTest, Bf16ActivationsEqualOneProcess) {
  run_case({.ranks = 2, .precision = kernels::ActivationPrecision::kBf16, .rows_of = uneven_rows});
}

TEST(SplitMlpBackendTest, PackedBf16EqualsOneProcess) {
  if (!kernels::packed_bf16_is_fast()) GTEST_SKIP() << "no packed BF16 kernel on this CPU";
  run_case({.ranks = 2,
            .precision = kernels::ActivationPrecision::kBf16,
            .packed = true,
            .rows_of = uneven_rows});
  run_case({.ranks = 4,
            .precision = kernels::ActivationPrecision::kBf16,
            .packed = true,
            .rows_of = uneven_rows});
}

TEST(SplitMlpBackendTest, OneRankWithTheOnlyTokenAndIdlePeers) {
  // Batch 1 under EP: rank 0 brings one row, the others none, at every call.
  const std::vector<int64_t> splits =
      run_case({.ranks = 4, .rows_of = [](int rank, int) { return rank == 0 ? int64_t{1} : 0; }});
  EXPECT_EQ(splits, (std::vector<int64_t>(4, 9)));
}

TEST(SplitMlpBackendTest, CallsAllocateNothing) {
  const RandomMoe moe = make_mlps(kernels::packed_bf16_is_fast());
  InProcessGroup group(2);
  std::vector<int64_t> allocations(2, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      SplitMlpBackendOptions options;
      options.communicator = comm.get();
      for (int layer = 0; layer < kLayers; ++layer) {
        options.mlps_by_layer.push_back(&moe.experts[layer][0]);
      }
      options.hidden_size = kHidden;
      options.max_rows_per_rank = 8;
      auto backend = SplitMlpBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok());
      const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kBf16};
      const std::vector<float> x = random_rows(8, rank);
      std::vector<float> out(8 * kHidden);
      auto call = [&](int i, int64_t rows) {
        return (*backend)->run(ctx, i % kLayers, x.data(), rows, out.data());
      };
      // Warm-up at the most rows: the products' per-thread scratch grows once.
      for (int i = 0; i < kLayers; ++i) ASSERT_TRUE(call(i, 8).ok());
      const int64_t before = testing::allocations_on_this_thread();
      for (int i = 0; i < 12; ++i) ASSERT_TRUE(call(i, rank == 0 ? i % 9 : (i * 5) % 9).ok());
      allocations[rank] = testing::allocations_on_this_thread() - before;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(allocations, (std::vector<int64_t>{0, 0}));
}

TEST(SplitMlpBackendTest, ZeroLimitNeverSplits) {
  const std::vector<int64_t> splits =
      run_case({.ranks = 2, .max_rows = 0, .rows_of = [](int, int) { return int64_t{0}; }});
  EXPECT_EQ(splits, (std::vector<int64_t>{0, 0}));
}

TEST(SplitMlpBackendTest, Int8MlpsAreDeclinedWithoutCommunicating) {
  RandomMoe moe = make_mlps(false);
  moe.add_int8(false, 5);
  // One rank only: a collective call would wait for the absent peer and time out.
  InProcessGroup group(2);
  auto comm = group.communicator(0);
  SplitMlpBackendOptions options;
  options.communicator = comm.get();
  options.mlps_by_layer = {&moe.experts[0][0]};
  options.hidden_size = kHidden;
  options.max_rows_per_rank = 8;
  options.peer_timeout = std::chrono::milliseconds(500);
  auto backend = SplitMlpBackend::create(std::move(options));
  ASSERT_TRUE(backend.ok());
  const std::vector<float> x = random_rows(1, 3);
  std::vector<float> out(kHidden);
  const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kFp32};
  Result<bool> done = (*backend)->run(ctx, 0, x.data(), 1, out.data());
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
}

TEST(SplitMlpBackendTest, ALostPeerIsNamedNotAHang) {
  // Rank 1 creates its backend (the window is collective), then never calls.
  const RandomMoe moe = make_mlps(false);
  InProcessGroup group(2);
  Status status = ok_status();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      SplitMlpBackendOptions options;
      options.communicator = comm.get();
      options.mlps_by_layer = {&moe.experts[0][0]};
      options.hidden_size = kHidden;
      options.max_rows_per_rank = 8;
      options.peer_timeout = std::chrono::milliseconds(300);
      auto backend = SplitMlpBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      if (rank == 1) return;
      const std::vector<float> x = random_rows(1, 3);
      std::vector<float> out(kHidden);
      const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kFp32};
      status = (*backend)->run(ctx, 0, x.data(), 1, out.data()).status();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rank 1"), std::string::npos) << status.to_string();
}

TEST(SplitMlpBackendTest, MisshapedWeightsAreNamed) {
  const RandomMoe moe = make_mlps(false);
  InProcessGroup group(1);
  auto comm = group.communicator(0);
  SplitMlpBackendOptions options;
  options.communicator = comm.get();
  options.mlps_by_layer = {nullptr, &moe.experts[1][0]};
  options.hidden_size = kHidden + 1;
  options.max_rows_per_rank = 8;
  auto backend = SplitMlpBackend::create(std::move(options));
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("layer 1"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::dist
