// Where ExpertExchange::dispatch sends a token's pairs when experts have copies.
#include "dist/expert_dispatch.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <functional>
#include <future>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "dist/expert_placement.h"
#include "dist/in_process_communicator.h"

namespace peerserve::dist {
namespace {

constexpr int64_t kHidden = 8;
constexpr int kLayer = 1;

// 4 experts on 2 ranks with 3 slots each: expert 0 only on rank 0, expert 3 only on rank 1,
// experts 1 and 2 on both.
ExpertPlacement two_copies_placement() {
  plan::ExpertLayout layout;
  layout.num_experts = 4;
  layout.num_ranks = 2;
  layout.slots_per_rank = 3;
  layout.physical_to_logical = {{0, 1, 2, 3, 1, 2}};
  auto placement = ExpertPlacement::create(layout, {kLayer});
  PS_CHECK(placement.ok()) << placement.status().to_string();
  return *placement;
}

// What each rank received: pairs, and the distinct expert slots they use.
struct Received {
  std::array<int, 2> pairs = {-1, -1};
  std::array<int, 2> experts = {-1, -1};
  // Rank 0's own account of its dispatch (ExpertExchange::last_dispatch_load).
  int64_t load_layer = -2;
  std::array<int, 2> load = {-1, -1};
};

// Rank 0 dispatches one token per entry of `tokens` (each its top-k ids), and rank 1 the
// same tokens when `both_send` (else none); the step is announced to both exchanges as the
// ranks' agreement would (set_step), and both ranks complete it (results and combine).
// Received: the pairs and distinct experts each rank got from all sources.
Received received_per_rank(const std::vector<std::vector<int32_t>>& tokens,
                           bool both_send = false) {
  const ExpertPlacement placement = two_copies_placement();
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t k = static_cast<int64_t>(tokens[0].size());
  std::vector<int32_t> ids;
  for (const auto& t : tokens) ids.insert(ids.end(), t.begin(), t.end());
  InProcessGroup group(2);
  Received got;
  std::array<Status, 2> status;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      ExchangeShape shape;
      shape.num_ranks = 2;
      shape.max_tokens_per_rank = static_cast<int>(n_tokens);
      shape.hidden_size = kHidden;
      shape.top_k = static_cast<int>(k);
      shape.slots_per_rank = placement.slots_per_rank();
      shape.dtype = DispatchDtype::kFp32;
      auto exchange = ExpertExchange::create(*comm, shape, std::chrono::milliseconds(20000));
      if (!exchange.ok()) {
        status[rank] = exchange.status();
        return;
      }
      const int64_t n = rank == 0 || both_send ? n_tokens : 0;
      std::vector<float> x(n * kHidden, 1.0f), w(n * k, 0.5f), out(n * kHidden);
      RoutedTokens routed;
      routed.layer = kLayer;
      routed.num_tokens = n;
      routed.hidden_size = kHidden;
      routed.top_k = k;
      routed.activations = x;
      routed.expert_ids = std::span<const int32_t>(ids).first(n * k);
      routed.weights = w;
      ExpertExchange& e = **exchange;
      const int senders = both_send ? 2 : 1;
      e.set_step(senders, senders * n_tokens);
      e.count_experts_up_to(n_tokens);
      status[rank] = e.dispatch(0, routed, placement);
      if (rank == 0) {
        const ExpertExchange::DispatchLoad load = e.last_dispatch_load();
        got.load_layer = load.layer;
        got.load = {load.experts_per_rank[0], load.experts_per_rank[1]};
      }
      if (status[rank].ok()) status[rank] = e.wait_dispatch(0);
      if (!status[rank].ok()) return;
      got.pairs[rank] = 0;
      std::set<int32_t> slots;
      const std::vector<float> row(kHidden, 2.0f);
      for (int source = 0; source < 2; ++source) {
        got.pairs[rank] += e.received_pairs(0, source);
        for (int i = 0; i < e.received_tokens(0, source); ++i) {
          const ReceivedToken token = e.received(0, source, i);
          slots.insert(token.local_slots, token.local_slots + token.num_entries);
        }
        for (int p = 0; p < e.received_pairs(0, source); ++p) {
          e.stage_result(0, source, p, row.data());
        }
      }
      got.experts[rank] = static_cast<int>(slots.size());
      status[rank] = e.send_results(0);
      if (status[rank].ok()) status[rank] = e.combine(0, routed, out);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) EXPECT_TRUE(s.ok()) << s.to_string();
  return got;
}

std::array<int, 2> pairs_per_rank(std::vector<int32_t> ids) {
  return received_per_rank({ids}).pairs;
}

TEST(ExpertDispatchTest, AReplicatedExpertGoesToTheRankWithFewerPairs) {
  // Expert 0 fixes one pair on rank 0; expert 1 has a copy on each rank and goes to rank 1.
  // (Before, copies were taken by token index alone: both pairs went to rank 0.)
  EXPECT_EQ(pairs_per_rank({0, 1}), (std::array<int, 2>{1, 1}));
  EXPECT_EQ(pairs_per_rank({1, 0}), (std::array<int, 2>{1, 1}));
  EXPECT_EQ(pairs_per_rank({3, 2}), (std::array<int, 2>{1, 1}));
}

TEST(ExpertDispatchTest, ReplicatedExpertsOfOneTokenSpreadOverTheRanks) {
  EXPECT_EQ(pairs_per_rank({1, 2}), (std::array<int, 2>{1, 1}));
  EXPECT_EQ(pairs_per_rank({2, 1}), (std::array<int, 2>{1, 1}));
  // Fixed experts are where they are: 0 and 3 split, and 1 and 2 take one rank each.
  EXPECT_EQ(pairs_per_rank({0, 3, 1, 2}), (std::array<int, 2>{2, 2}));
  // 0 fixes rank 0, 1 goes to rank 1, and 2 ties: token 0 of rank 0 starts at the first copy.
  EXPECT_EQ(pairs_per_rank({0, 1, 2}), (std::array<int, 2>{2, 1}));
}

TEST(ExpertDispatchTest, AnExpertsTokensStayOnOneCopyWhileTheRanksAreBalanced) {
  // Token 0 puts expert 1 on rank 0 and expert 2 on rank 1. Token 1 chooses them again:
  // each follows its first copy (its weights are read there anyway). Balancing pairs alone
  // would have sent token 1's expert 1 to rank 1, reading expert 1's weights on both ranks.
  const Received got = received_per_rank({{1, 2}, {1, 2}});
  EXPECT_EQ(got.pairs, (std::array<int, 2>{2, 2}));
  EXPECT_EQ(got.experts, (std::array<int, 2>{1, 1}));
  // Many tokens of one replicated expert, nothing else: its copy on the idle rank pays for
  // reading the weights a second time, and the tokens split over both.
  const Received hot = received_per_rank(std::vector<std::vector<int32_t>>(40, {1}));
  EXPECT_EQ(hot.experts, (std::array<int, 2>{1, 1}));
  EXPECT_GE(hot.pairs[0], 12);
  EXPECT_GE(hot.pairs[1], 12);
}

TEST(ExpertDispatchTest, TheSourceCountsTheExpertsItUsesOnEachRank) {
  // Experts 0 (rank 0) and 3 (rank 1) by three tokens: one expert on each rank, however
  // many pairs.
  Received got = received_per_rank({{0, 3}, {3, 0}, {0, 3}});
  EXPECT_EQ(got.load_layer, kLayer);
  EXPECT_EQ(got.load, (std::array<int, 2>{1, 1}));
  // A replicated expert counts on the rank of the copy it went to: 0 fixes rank 0, 1 goes to
  // rank 1 (fewer pairs), 2 to rank 0 (a tie).
  got = received_per_rank({{0, 1, 2}});
  EXPECT_EQ(got.load, (std::array<int, 2>{2, 1}));
  EXPECT_EQ(got.experts, got.load);
}

TEST(ExpertDispatchTest, SourcesOfASmallStepSendAnExpertToOneCopy) {
  // Both ranks bring the same two tokens. Balancing each source's own pairs, rank 0 put
  // expert 1 on rank 0 and rank 1 put it on rank 1 (and expert 2 the other way round), so
  // both experts were read on both ranks: 4 experts read instead of 2.
  const Received got = received_per_rank({{1, 2}, {2, 1}}, /*both_send=*/true);
  EXPECT_EQ(got.experts[0] + got.experts[1], 2);
  EXPECT_EQ(got.pairs[0] + got.pairs[1], 8);
  // Replicated and fixed experts mixed: 0 and 3 stay where they are, 1 and 2 once each.
  const Received mixed = received_per_rank({{0, 1}, {3, 2}, {1, 2}}, /*both_send=*/true);
  EXPECT_EQ(mixed.experts[0] + mixed.experts[1], 4);
}

TEST(ExpertDispatchTest, SourcesOfALargeStepStillSpreadAHotExpert) {
  // 2 x 130 tokens all on expert 1: 260 pairs outweigh reading it twice (kTouchCost 64 per
  // expert, 4 experts), so each source balances its pairs over both copies.
  const Received hot =
      received_per_rank(std::vector<std::vector<int32_t>>(130, {1}), /*both_send=*/true);
  EXPECT_EQ(hot.experts, (std::array<int, 2>{1, 1}));
  EXPECT_GE(hot.pairs[0], 80);
  EXPECT_GE(hot.pairs[1], 80);
}

// Rank 0 sends rank 1 one token for experts {0, 3, 1}; the test then rewrites the message
// in rank 1's window (as a corrupt or mismatched peer would) before rank 1 reads it.
Status receive_rewritten_message(const std::function<void(int32_t* fields)>& rewrite) {
  const ExpertPlacement placement = two_copies_placement();
  const std::vector<int32_t> ids = {0, 3, 1};
  InProcessGroup group(2);
  std::array<Status, 2> status;
  std::promise<void> sent;
  std::shared_future<void> sent_future = sent.get_future().share();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank, comm = group.communicator(rank)] {
      ExchangeShape shape;
      shape.num_ranks = 2;
      shape.max_tokens_per_rank = 1;
      shape.hidden_size = kHidden;
      shape.top_k = 3;
      shape.slots_per_rank = placement.slots_per_rank();
      shape.dtype = DispatchDtype::kFp32;
      auto exchange = ExpertExchange::create(*comm, shape, std::chrono::milliseconds(2000));
      if (!exchange.ok()) {
        status[rank] = exchange.status();
        if (rank == 0) sent.set_value();
        return;
      }
      const int64_t n = rank == 0 ? 1 : 0;
      std::vector<float> x(n * kHidden, 1.0f), w(n * 3, 0.5f);
      RoutedTokens routed;
      routed.layer = kLayer;
      routed.num_tokens = n;
      routed.hidden_size = kHidden;
      routed.top_k = 3;
      routed.activations = x;
      routed.expert_ids = std::span<const int32_t>(ids).first(n * 3);
      routed.weights = w;
      ExpertExchange& e = **exchange;
      e.set_step(1, 1);
      status[rank] = e.dispatch(0, routed, placement);
      if (rank == 0) {
        sent.set_value();
        return;  // never completes the step: rank 1 must refuse the message, not wait
      }
      sent_future.wait();
      if (!status[rank].ok()) return;
      // The message's fields: token, entry count, scale, reserved, then slots.
      const ReceivedToken token = e.received(0, 0, 0);
      rewrite(reinterpret_cast<int32_t*>(const_cast<std::byte*>(token.header)));
      status[rank] = e.wait_dispatch(0);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(status[0].ok()) << status[0].to_string();
  return status[1];
}

TEST(ExpertDispatchTest, AMessageThatDoesNotAddUpToItsHeaderIsRefused) {
  // As sent: rank 1 holds expert 3 of the token, and expert 1 when its copy there is chosen.
  int32_t sent_entries = 0;
  EXPECT_TRUE(receive_rewritten_message([&](int32_t* f) { sent_entries = f[1]; }).ok());
  ASSERT_GE(sent_entries, 1);
  ASSERT_LE(sent_entries, 2);
  for (const int32_t entries : {0, sent_entries == 1 ? 2 : 1, 4, -1, 1 << 30}) {
    const Status s = receive_rewritten_message([&](int32_t* f) { f[1] = entries; });
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << entries << ": " << s.to_string();
    EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.to_string();
  }
  // A result slot outside the source's pairs (4 fields, then 3 local slots, then pair slots).
  for (const int32_t pair : {sent_entries, -1, 1 << 30}) {
    const Status s = receive_rewritten_message([&](int32_t* f) { f[4 + 3] = pair; });
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << pair << ": " << s.to_string();
  }
}

}  // namespace
}  // namespace peerserve::dist
