// TensorParallelBackend: the attention projections, the dense/shared-expert MLP and the LM
// head split over N in-process ranks give, on every rank, bitwise what the rank computes
// alone (the model's products: grouped q_a/kv_a, q_b, o_proj, the head, and run_mlp's
// grouped gate/up, SiLU, down), for fp32 and bf16 activations and the packed BF16 weights, with
// slice widths that are not multiples of the kernels' tiles; every rank declines alike when one
// brings too many rows; INT8 weights are declined without communicating; a lost peer is named.
#include "dist/tensor_parallel_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "dist/in_process_communicator.h"
#include "kernels/activation.h"
#include "kernels/matmul_packed_bf16.h"
#include "model/weight_packing.h"
#include "tensor/float_convert.h"
#include "tests/dist/allocation_counter.h"
#include "tests/dist/random_moe.h"

namespace peerserve::dist {
namespace {

using testing::RandomMoe;

// Hidden 64; q_lora 48, kv_a 40 wide, q_b 96 wide, o_proj from 64, a vocabulary of 80: at 4
// ranks the slices are 12, 10, 24, 16 and 20 columns wide.
constexpr int64_t kHidden = 64, kInter = 96, kQLora = 48, kKvWidth = 40, kQWidth = 96;
constexpr int64_t kVocab = 80;
constexpr int kLayers = 3;

struct Weights {
  RandomMoe moe{kHidden, kInter, 1, 1, {0, 1, 2}, 17};  // expert 0: each layer's MLP
  std::vector<AttentionWeights> attention;
  LinearWeight head;
  std::vector<std::shared_ptr<std::vector<bf16>>> storage;

  explicit Weights(bool packed, bool int8 = false) {
    std::mt19937_64 rng(29);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto matrix = [&](int64_t rows, int64_t cols) {
      auto data = std::make_shared<std::vector<bf16>>(rows * cols);
      for (bf16& v : *data) v = float_to_bf16(normal(rng) / std::sqrt(float(cols)));
      storage.push_back(data);
      return LinearWeight{data->data(), rows, cols, data, nullptr, nullptr, nullptr};
    };
    head = matrix(kVocab, kHidden);
    if (packed) PS_CHECK(pack_linear_bf16(head).ok());
    for (int layer = 0; layer < kLayers; ++layer) {
      AttentionWeights& a = attention.emplace_back();
      a.q_a = matrix(kQLora, kHidden);
      a.kv_a = matrix(kKvWidth, kHidden);
      a.q_b = matrix(kQWidth, kQLora);
      a.o_proj = matrix(kHidden, kHidden);
      if (packed) {
        for (LinearWeight* w : {&*a.q_a, &a.kv_a, &*a.q_b, &a.o_proj}) {
          PS_CHECK(pack_linear_bf16(*w).ok());
        }
        PS_CHECK(pack_mlp_bf16(moe.experts[layer][0]).ok());
      }
    }
    if (int8) moe.add_int8(false, 5);
  }

  TensorParallelOptions options(Communicator* comm, int max_rows,
                                bool shared_experts = false) const {
    TensorParallelOptions o;
    o.communicator = comm;
    for (int layer = 0; layer < kLayers; ++layer) {
      o.layers.push_back({.mlp = &moe.experts[layer][0],
                          .shared_expert = shared_experts,
                          .attention = &attention[layer]});
    }
    o.lm_head = &head;
    o.hidden_size = kHidden;
    o.max_rows_per_rank = max_rows;
    o.peer_timeout = std::chrono::milliseconds(20000);
    return o;
  }
};

// The products of one call kind: input width and output widths.
enum class Kind { kDown, kQueryUp, kOutput, kMlp, kHead };
constexpr Kind kKinds[] = {Kind::kDown, Kind::kQueryUp, Kind::kOutput, Kind::kMlp, Kind::kHead};
constexpr int kNumKinds = 5;

int64_t input_width(Kind kind) {
  return kind == Kind::kQueryUp ? kQLora : kHidden;
}

// What one process computes for `kind` (the model's products).
std::vector<std::vector<float>> local_products(const ComputeContext& ctx, const Weights& w,
                                               int layer, Kind kind, const float* x, int64_t rows) {
  const AttentionWeights& a = w.attention[layer];
  switch (kind) {
    case Kind::kDown: {
      std::vector<std::vector<float>> out{std::vector<float>(rows * kQLora),
                                          std::vector<float>(rows * kKvWidth)};
      const LinearProblem p[2] = {{.x = x, .w = &*a.q_a, .y = out[0].data(), .m = rows},
                                  {.x = x, .w = &a.kv_a, .y = out[1].data(), .m = rows}};
      grouped_linear(ctx, p);
      return out;
    }
    case Kind::kQueryUp: {
      std::vector<std::vector<float>> out{std::vector<float>(rows * kQWidth)};
      linear(ctx, x, rows, *a.q_b, out[0].data());
      return out;
    }
    case Kind::kOutput: {
      std::vector<std::vector<float>> out{std::vector<float>(rows * kHidden)};
      linear(ctx, x, rows, a.o_proj, out[0].data());
      return out;
    }
    case Kind::kHead: {
      std::vector<std::vector<float>> out{std::vector<float>(rows * kVocab)};
      linear(ctx, x, rows, w.head, out[0].data());
      return out;
    }
    case Kind::kMlp: {
      const MlpWeights& m = w.moe.experts[layer][0];
      std::vector<float> gate(rows * kInter), up(rows * kInter);
      std::vector<std::vector<float>> out{std::vector<float>(rows * kHidden)};
      const LinearProblem p[2] = {{.x = x, .w = &m.gate, .y = gate.data(), .m = rows},
                                  {.x = x, .w = &m.up, .y = up.data(), .m = rows}};
      grouped_bf16_linear(ctx, p);
      kernels::silu_mul(gate.data(), up.data(), gate.data(), rows * kInter);
      linear(ctx, gate.data(), rows, m.down, out[0].data());
      return out;
    }
  }
  return {};
}

Result<bool> split_products(TensorParallelBackend& backend, const ComputeContext& ctx, int layer,
                            Kind kind, const float* x, int64_t rows,
                            std::vector<std::vector<float>>& out) {
  if (kind == Kind::kMlp) {
    // As the model does: the output may be completed only by finish_mlp.
    Result<bool> done = backend.run_mlp(ctx, layer, x, rows, out[0].data());
    if (done.ok() && *done) PS_RETURN_IF_ERROR(backend.finish_mlp());
    return done;
  }
  std::vector<float*> outs;
  for (std::vector<float>& o : out) outs.push_back(o.data());
  const ReplicatedProjection which =
      kind == Kind::kDown      ? ReplicatedProjection::kAttentionDown
      : kind == Kind::kQueryUp ? ReplicatedProjection::kAttentionQueryUp
      : kind == Kind::kOutput  ? ReplicatedProjection::kAttentionOutput
                               : ReplicatedProjection::kLmHead;
  return backend.run_projection(ctx, layer, which, x, rows, outs);
}

std::vector<float> random_rows(int64_t rows, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * width);
  for (float& v : x) v = normal(rng);
  return x;
}

struct Case {
  int ranks = 2;
  kernels::ActivationPrecision precision = kernels::ActivationPrecision::kFp32;
  bool packed = false;
  int max_rows = 8;
  int calls = 30;
  std::function<int64_t(int rank, int call)> rows_of;
  // When set, every layer's MLP is a shared expert and this gives the routed experts rank
  // `rank`'s dispatch sent to each rank before call `call` (empty: it has none); the shared
  // expert counts as one routed expert. whole_shared gets each rank's whole_shared_calls().
  std::function<std::vector<int32_t>(int rank, int call)> routed = nullptr;
  std::vector<int64_t>* whole_shared = nullptr;
};

// Runs the calls (cycling through the kinds and layers) on every rank; returns the number of
// calls each rank saw split.
std::vector<int64_t> run_case(const Case& c) {
  const Weights weights(c.packed);
  InProcessGroup group(c.ranks);
  std::vector<int64_t> splits(c.ranks, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < c.ranks; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      int call = 0;
      TensorParallelOptions options =
          weights.options(comm.get(), c.max_rows, static_cast<bool>(c.routed));
      if (c.routed) {
        options.routed_experts = [&, rank](int64_t, std::span<int32_t> out) {
          const std::vector<int32_t> loads = c.routed(rank, call);
          if (loads.empty()) return false;
          std::copy(loads.begin(), loads.end(), out.begin());
          return true;
        };
        options.routed_intermediate = kInter;
      }
      auto backend = TensorParallelBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      const ComputeContext ctx{.pool = nullptr, .precision = c.precision};
      for (call = 0; call < c.calls; ++call) {
        const Kind kind = kKinds[call % kNumKinds];
        const int layer = (call / kNumKinds) % kLayers;
        const int64_t rows = c.rows_of(rank, call);
        bool all_fit = c.max_rows > 0;
        for (int r = 0; r < c.ranks; ++r) all_fit = all_fit && c.rows_of(r, call) <= c.max_rows;
        const std::vector<float> x = random_rows(rows, input_width(kind), 1000 * rank + call);
        std::vector<std::vector<float>> want =
            local_products(ctx, weights, layer, kind, x.data(), rows);
        std::vector<std::vector<float>> out = want;
        for (std::vector<float>& o : out) std::fill(o.begin(), o.end(), -7.0f);
        Result<bool> done = split_products(**backend, ctx, layer, kind, x.data(), rows, out);
        ASSERT_TRUE(done.ok()) << done.status().to_string();
        EXPECT_EQ(*done, all_fit) << "rank " << rank << " call " << call;
        for (size_t j = 0; j < out.size(); ++j) {
          if (!*done) {
            for (float v : out[j]) ASSERT_EQ(v, -7.0f) << "a declined call wrote its output";
            continue;
          }
          if (want[j].empty()) continue;  // memcmp takes no null pointer, even for 0 bytes
          ASSERT_EQ(std::memcmp(out[j].data(), want[j].data(), want[j].size() * sizeof(float)), 0)
              << "rank " << rank << " call " << call << " (kind " << static_cast<int>(kind) << ", "
              << rows << " rows) output " << j << " differs";
        }
      }
      splits[rank] = (*backend)->split_calls();
      if (c.whole_shared != nullptr) (*c.whole_shared)[rank] = (*backend)->whole_shared_calls();
    });
  }
  for (std::thread& t : threads) t.join();
  return splits;
}

// Uneven rows, idle ranks, and in calls 3, 10, 17, 24 (four different kinds) one rank over
// the limit.
int64_t uneven_rows(int rank, int call) {
  if (call % 7 == 3 && rank == 1) return 11;
  return (rank * 5 + call * 3) % 9;
}

TEST(TensorParallelBackendTest, Fp32TwoRanksEqualsOneProcess) {
  EXPECT_EQ(run_case({.ranks = 2, .rows_of = uneven_rows}), (std::vector<int64_t>(2, 26)));
}

TEST(TensorParallelBackendTest, Fp32FourRanksEqualsOneProcess) {
  EXPECT_EQ(run_case({.ranks = 4, .rows_of = uneven_rows}), (std::vector<int64_t>(4, 26)));
}

TEST(TensorParallelBackendTest, Bf16ActivationsEqualOneProcess) {
  run_case({.ranks = 2, .precision = kernels::ActivationPrecision::kBf16, .rows_of = uneven_rows});
  run_case({.ranks = 4, .precision = kernels::ActivationPrecision::kBf16, .rows_of = uneven_rows});
}

TEST(TensorParallelBackendTest, PackedBf16EqualsOneProcess) {
  if (!kernels::packed_bf16_is_fast()) GTEST_SKIP() << "no packed BF16 kernel on this CPU";
  for (int ranks : {2, 4}) {
    run_case({.ranks = ranks,
              .precision = kernels::ActivationPrecision::kBf16,
              .packed = true,
              .rows_of = uneven_rows});
  }
}

TEST(TensorParallelBackendTest, OneRankWithTheOnlyTokenAndIdlePeers) {
  // Batch 1 under EP: rank 0 brings one row, the others none, at every call.
  const std::vector<int64_t> splits =
      run_case({.ranks = 4, .rows_of = [](int rank, int) { return rank == 0 ? int64_t{1} : 0; }});
  EXPECT_EQ(splits, (std::vector<int64_t>(4, 30)));
}

TEST(TensorParallelBackendTest, TheSharedExpertGoesToTheRankWithFewerRoutedExperts) {
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{4, 2}, 1.0), 1);
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{2, 5}, 1.0), 0);
  // Balanced: an even split is better.
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{3, 3}, 1.0), -1);
  // Two routed experts' worth of shared expert over a gap of one: even (4.5 + 1 vs 3 + 2).
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{4, 3}, 2.0), -1);
  // Four ranks: the first lightest takes it when that lowers the maximum.
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{2, 1, 1, 2}, 1.0), 1);
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{2, 2, 2, 1}, 1.0), 3);
  EXPECT_EQ(TensorParallelBackend::shared_expert_rank(std::vector<int64_t>{2, 2, 2, 2}, 1.0), -1);
}

TEST(TensorParallelBackendTest, AWholeSharedExpertEqualsOneProcess) {
  // Rank 0's dispatch sends 4 routed experts to rank 0 and 2 to rank 1 before even calls,
  // 3 and 3 before odd ones; rank 1 brings rows but routes nothing. The MLP calls are calls
  // 3, 8, 13, 18, 23, 28; 3 is declined (rank 1 over the limit), and 8, 18 and 28 run
  // whole on rank 1. Outputs are checked bitwise against one process by run_case.
  std::vector<int64_t> whole(2, -1);
  run_case({.ranks = 2,
            .rows_of = uneven_rows,
            .routed =
                [](int rank, int call) {
                  if (rank != 0) return std::vector<int32_t>{0, 0};
                  return call % 2 == 0 ? std::vector<int32_t>{4, 2} : std::vector<int32_t>{3, 3};
                },
            .whole_shared = &whole});
  EXPECT_EQ(whole, (std::vector<int64_t>{3, 3}));
  // Four ranks, one token on rank 0 whose experts are on ranks 0, 0, 1, 3 and 3: rank 2
  // takes the shared expert at every MLP call (6 of 30).
  std::vector<int64_t> four(4, -1);
  run_case(
      {.ranks = 4,
       .rows_of = [](int rank, int) { return rank == 0 ? int64_t{1} : 0; },
       .routed =
           [](int rank, int) {
             return rank == 0 ? std::vector<int32_t>{2, 1, 0, 2} : std::vector<int32_t>{0, 0, 0, 0};
           },
       .whole_shared = &four});
  EXPECT_EQ(four, (std::vector<int64_t>(4, 6)));
  // A rank without loads for the layer: every rank splits evenly.
  std::vector<int64_t> unknown(2, -1);
  run_case({.ranks = 2,
            .rows_of = uneven_rows,
            .routed =
                [](int rank, int) {
                  return rank == 0 ? std::vector<int32_t>{4, 2} : std::vector<int32_t>{};
                },
            .whole_shared = &unknown});
  EXPECT_EQ(unknown, (std::vector<int64_t>{0, 0}));
}

TEST(TensorParallelBackendTest, TheNextCallCompletesAWholeSharedExpert) {
  // run_mlp leaves the whole shared expert's rows to finish_mlp; without it, the next call
  // (here the output projection) takes them first.
  const Weights weights(false);
  InProcessGroup group(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      TensorParallelOptions options = weights.options(comm.get(), 8, /*shared_experts=*/true);
      options.routed_experts = [rank](int64_t, std::span<int32_t> out) {
        out[0] = rank == 0 ? 4 : 0;
        out[1] = rank == 0 ? 2 : 0;
        return true;
      };
      options.routed_intermediate = kInter;
      auto backend = TensorParallelBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kFp32};
      const int64_t rows = rank == 0 ? 2 : 1;
      const std::vector<float> x = random_rows(rows, kHidden, 7 + rank);
      const std::vector<std::vector<float>> want =
          local_products(ctx, weights, 1, Kind::kMlp, x.data(), rows);
      std::vector<float> mlp(rows * kHidden, -7.0f), y(rows * kHidden);
      Result<bool> done = (*backend)->run_mlp(ctx, 1, x.data(), rows, mlp.data());
      ASSERT_TRUE(done.ok() && *done) << done.status().to_string();
      EXPECT_EQ((*backend)->whole_shared_calls(), 1);
      float* outs[] = {y.data()};
      done = (*backend)->run_projection(ctx, 1, ReplicatedProjection::kAttentionOutput, x.data(),
                                        rows, outs);
      ASSERT_TRUE(done.ok() && *done) << done.status().to_string();
      EXPECT_EQ(std::memcmp(mlp.data(), want[0].data(), mlp.size() * sizeof(float)), 0)
          << "rank " << rank;
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(TensorParallelBackendTest, ZeroLimitNeverSplits) {
  const std::vector<int64_t> splits =
      run_case({.ranks = 2, .max_rows = 0, .rows_of = [](int, int) { return int64_t{0}; }});
  EXPECT_EQ(splits, (std::vector<int64_t>{0, 0}));
}

TEST(TensorParallelBackendTest, CallsAllocateNothing) {
  const Weights weights(kernels::packed_bf16_is_fast());
  InProcessGroup group(2);
  std::vector<int64_t> allocations(2, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      auto backend = TensorParallelBackend::create(weights.options(comm.get(), 8));
      ASSERT_TRUE(backend.ok());
      const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kBf16};
      const std::vector<float> x = random_rows(8, kHidden, rank);
      std::vector<float> a(8 * kQWidth), b(8 * kQWidth);  // the widest output (q_b)
      float* const outs[2] = {a.data(), b.data()};
      auto call = [&](int i, int64_t rows) -> Result<bool> {
        switch (i % kNumKinds) {
          case 0:
            return (*backend)->run_projection(
                ctx, i % kLayers, ReplicatedProjection::kAttentionDown, x.data(), rows, outs);
          case 1:
            return (*backend)->run_projection(ctx, i % kLayers,
                                              ReplicatedProjection::kAttentionQueryUp, x.data(),
                                              rows, std::span(outs, 1));
          case 2:
            return (*backend)->run_projection(ctx, i % kLayers,
                                              ReplicatedProjection::kAttentionOutput, x.data(),
                                              rows, std::span(outs, 1));
          case 3:
            return (*backend)->run_projection(ctx, 0, ReplicatedProjection::kLmHead, x.data(), rows,
                                              std::span(outs, 1));
          default:
            return (*backend)->run_mlp(ctx, i % kLayers, x.data(), rows, a.data());
        }
      };
      // Warm-up at the most rows: the products' per-thread scratch grows once.
      for (int i = 0; i < 12; ++i) ASSERT_TRUE(call(i, 8).ok());
      const int64_t before = testing::allocations_on_this_thread();
      for (int i = 0; i < 24; ++i) ASSERT_TRUE(call(i, rank == 0 ? i % 9 : (i * 5) % 9).ok());
      allocations[rank] = testing::allocations_on_this_thread() - before;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(allocations, (std::vector<int64_t>{0, 0}));
}

TEST(TensorParallelBackendTest, Int8WeightsAreDeclinedWithoutCommunicating) {
  Weights weights(false, /*int8=*/true);
  std::vector<LinearWeight*> projections = {&weights.head};
  for (AttentionWeights& a : weights.attention) {
    for (LinearWeight* w : {&*a.q_a, &a.kv_a, &*a.q_b, &a.o_proj}) projections.push_back(w);
  }
  for (LinearWeight* w : projections) {
    auto q = kernels::PackedInt8Matrix::quantize(
        kernels::MatrixView<bf16>{w->data, w->rows, w->cols, 0});
    PS_CHECK(q.ok());
    w->int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(q).value());
  }
  // One rank of two: a collective call (or window) would wait for the absent peer.
  InProcessGroup group(2);
  auto comm = group.communicator(0);
  TensorParallelOptions options = weights.options(comm.get(), 8);
  options.peer_timeout = std::chrono::milliseconds(500);
  auto backend = TensorParallelBackend::create(std::move(options));
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  EXPECT_EQ((*backend)->split_layers(), 0);
  const std::vector<float> x = random_rows(1, kHidden, 3);
  std::vector<float> out(kHidden);
  const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kFp32};
  Result<bool> done = (*backend)->run_mlp(ctx, 0, x.data(), 1, out.data());
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  float* const outs[1] = {out.data()};
  done =
      (*backend)->run_projection(ctx, 0, ReplicatedProjection::kAttentionOutput, x.data(), 1, outs);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  std::vector<float> logits(kVocab);
  float* const head_out[1] = {logits.data()};
  done = (*backend)->run_projection(ctx, 0, ReplicatedProjection::kLmHead, x.data(), 1, head_out);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  EXPECT_FALSE((*backend)->splits_lm_head());
}

TEST(TensorParallelBackendTest, ALostPeerIsNamedNotAHang) {
  // Rank 1 creates its backend (the window is collective), then never calls.
  const Weights weights(false);
  InProcessGroup group(2);
  Status status = ok_status();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      TensorParallelOptions options = weights.options(comm.get(), 8);
      options.peer_timeout = std::chrono::milliseconds(300);
      auto backend = TensorParallelBackend::create(std::move(options));
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      if (rank == 1) return;
      const std::vector<float> x = random_rows(1, kHidden, 3);
      std::vector<float> out(kHidden);
      const ComputeContext ctx{.pool = nullptr, .precision = kernels::ActivationPrecision::kFp32};
      status = (*backend)->run_mlp(ctx, 0, x.data(), 1, out.data()).status();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rank 1"), std::string::npos) << status.to_string();
}

TEST(TensorParallelBackendTest, BuffersOverTheBoundAreRefusedBeforeAllocating) {
  // The most rows the option allows, against a bound this small model's buffers exceed (V3's
  // would want tens of GiB per rank: bad_alloc or the OOM killer at creation, before).
  // Refused before allocating or creating the window (one rank of two: a collective would
  // wait for the absent peer).
  const Weights weights(false);
  InProcessGroup group(2);
  auto comm = group.communicator(0);
  TensorParallelOptions options = weights.options(comm.get(), 1 << 16);
  options.max_buffer_bytes = 1 << 20;
  options.peer_timeout = std::chrono::milliseconds(500);
  auto backend = TensorParallelBackend::create(std::move(options));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(backend.status().message().find("65536 rows per rank needs"), std::string::npos)
      << backend.status().message();
  EXPECT_NE(backend.status().message().find("over the 1 MiB allowed"), std::string::npos)
      << backend.status().message();
}

TEST(TensorParallelBackendTest, MisshapedMlpIsNamed) {
  const Weights weights(false);
  InProcessGroup group(1);
  auto comm = group.communicator(0);
  TensorParallelOptions options = weights.options(comm.get(), 8);
  options.layers[0].mlp = nullptr;
  options.hidden_size = kHidden + 1;
  auto backend = TensorParallelBackend::create(std::move(options));
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("layer 1"), std::string::npos);
}

}  // namespace
}  // namespace peerserve::dist
