// The data-parallel front end: rank 0 spreads requests over the engines of every rank
// (in-process ranks here, each with its own engine thread and the paged fake model), the
// outputs come back as if one engine had run them, aborts reach the owning rank, stopping
// ends the other ranks' requests and the group, and a lost rank is an error everywhere.
#include "runtime/data_parallel_router.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/byte_io.h"
#include "dist/in_process_communicator.h"
#include "dist/step_coordinator.h"
#include "runtime/request_codec.h"
#include "tests/runtime/fake_executor.h"

namespace peerserve {
namespace {

using std::chrono::milliseconds;
using testing::reference_generate;

constexpr int32_t kVocab = 64;

class Collector {
 public:
  EngineClient::OutputSink sink() {
    return [this](RequestOutput out) {
      std::lock_guard<std::mutex> lock(mutex_);
      outputs_[out.request_id].push_back(std::move(out));
      cv_.notify_all();
    };
  }
  // Every output of `id` once the last arrived (empty on a 20 s timeout).
  std::vector<RequestOutput> wait(RequestId id) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      auto it = outputs_.find(id);
      return it != outputs_.end() && it->second.back().finished;
    });
    return done ? outputs_[id] : std::vector<RequestOutput>{};
  }
  bool wait_first(RequestId id) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return outputs_.count(id) > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<RequestId, std::vector<RequestOutput>> outputs_;
};

std::vector<TokenId> tokens_of(const std::vector<RequestOutput>& outputs, int32_t choice = 0) {
  std::vector<TokenId> tokens;
  for (const RequestOutput& out : outputs) {
    for (const ChoiceDelta& d : out.choices) {
      if (d.index == choice) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  return tokens;
}

std::optional<FinishReason> finish_of(const std::vector<RequestOutput>& outputs,
                                      int32_t choice = 0) {
  std::optional<FinishReason> reason;
  for (const RequestOutput& out : outputs) {
    for (const ChoiceDelta& d : out.choices) {
      if (d.index == choice && d.finish_reason) reason = d.finish_reason;
    }
  }
  return reason;
}

GenerationParams greedy(int32_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

// N ranks, each with a communicator, a step coordinator, a router and an engine.
class Group {
 public:
  // `mail_limit` (when not 0): the most mail an agreement takes from a rank, as the step
  // coordinator's own limit but small; the routers are told it.
  // `tamper` (when set) edits rank 0's copy of each agreement, as a corrupt rank would.
  // `max_waiting_seqs`: every engine's waiting-queue limit.
  explicit Group(int size, milliseconds timeout = milliseconds(5000), size_t mail_limit = 0,
                 std::function<void(dist::StepAgreement*)> tamper = {},
                 int32_t max_waiting_seqs = 100)
      : group_(size) {
    for (int r = 0; r < size; ++r) {
      Rank rank;
      rank.comm = group_.communicator(r);
      rank.coordinator = std::make_unique<dist::StepCoordinator>(rank.comm.get(), timeout);
      rank.router = std::make_unique<DataParallelRouter>(
          r, size,
          [c = rank.coordinator.get(), mail_limit, tamper = r == 0 ? tamper : nullptr](
              int64_t rows, bool stop,
              std::span<const std::byte> mail) -> Result<dist::StepAgreement> {
            if (mail_limit > 0 && mail.size() > mail_limit) {
              return invalid_argument("mail of " + std::to_string(mail.size()) +
                                      " bytes is over the limit of " + std::to_string(mail_limit));
            }
            Result<dist::StepAgreement> agreement = c->agree(rows, stop, mail);
            if (agreement.ok() && tamper) tamper(&*agreement);
            return agreement;
          },
          mail_limit > 0 ? mail_limit : dist::StepCoordinator::kMaxMailBytes);
      EngineOptions options;
      options.scheduler.max_num_seqs = 8;
      options.scheduler.max_num_batched_tokens = 64;
      options.scheduler.max_model_len = 256;
      options.scheduler.max_waiting_seqs = max_waiting_seqs;
      options.scheduler.block_pool = {
          .num_blocks = 128, .block_size = 4, .enable_prefix_caching = true};
      options.vocab_size = kVocab;
      options.lockstep = [router = rank.router.get()](int64_t rows) {
        return router->lockstep(rows);
      };
      options.lockstep_broken = [router = rank.router.get()](const Status& why) {
        router->break_group(why);
      };
      auto executor = std::make_unique<testing::FakeExecutor>(128, 4, kVocab);
      rank.executor = executor.get();
      auto engine = Engine::create(options, std::move(executor), nullptr);
      PS_CHECK(engine.ok()) << engine.status().to_string();
      rank.engine = std::move(engine).value();
      rank.router->attach(rank.engine.get());
      // Stand-in expert load counts: rank r counted {r + 1, 10 (r + 1)}.
      rank.router->set_expert_counts([r] { return std::vector<int64_t>{r + 1, 10 * (r + 1)}; });
      ranks_.push_back(std::move(rank));
    }
    for (Rank& rank : ranks_) rank.engine->start();
  }
  ~Group() {
    for (Rank& rank : ranks_) rank.engine->stop();
  }

  DataParallelRouter& front() { return *ranks_[0].router; }
  DataParallelRouter& router(int r) { return *ranks_[r].router; }
  Engine& engine(int r) { return *ranks_[r].engine; }
  testing::FakeExecutor& executor(int r) { return *ranks_[r].executor; }

 private:
  struct Rank {
    std::unique_ptr<dist::Communicator> comm;
    std::unique_ptr<dist::StepCoordinator> coordinator;
    std::unique_ptr<DataParallelRouter> router;
    std::unique_ptr<Engine> engine;
    testing::FakeExecutor* executor = nullptr;  // owned by engine
  };
  dist::InProcessGroup group_;
  std::vector<Rank> ranks_;
};

std::vector<TokenId> prompt(int i) {
  std::vector<TokenId> p;
  for (int k = 0; k < 5 + i; ++k) p.push_back(static_cast<TokenId>((i * 7 + k * 3) % kVocab));
  return p;
}

TEST(DataParallelRouterTest, SpreadsRequestsOverTheRanksWithTheSameTokens) {
  Group group(3);
  Collector collector;
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) {
    auto id = group.front().submit({prompt(i), greedy(12)}, collector.sink());
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  // Least loaded: two requests each, whatever order they finish in.
  EXPECT_EQ(group.front().routed_total(), (std::vector<int64_t>{2, 2, 2}));
  for (int i = 0; i < 6; ++i) {
    auto outputs = collector.wait(ids[i]);
    ASSERT_FALSE(outputs.empty()) << "request " << i << " never finished";
    EXPECT_EQ(tokens_of(outputs), reference_generate(prompt(i), 12, kVocab, std::nullopt))
        << "request " << i;
    EXPECT_EQ(finish_of(outputs), FinishReason::kLength);
    EXPECT_TRUE(outputs.back().error.ok());
    EXPECT_EQ(outputs.back().usage.prompt_tokens, static_cast<int64_t>(prompt(i).size()));
    EXPECT_EQ(outputs.back().usage.completion_tokens, 12);
  }
  EXPECT_EQ(group.front().outstanding(), (std::vector<int64_t>{0, 0, 0}));
  // Every rank's engine ran its share.
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(group.engine(r).metrics().requests_finished_total[0] +
                  group.engine(r).metrics().requests_finished_total[1],
              2)
        << "rank " << r;
  // Rank 0's metrics count the group: the other ranks' reports came with their last outputs.
  const EngineMetricsSnapshot total = group.front().metrics();
  int64_t finished = 0;
  for (int64_t n : total.requests_finished_total) finished += n;
  EXPECT_EQ(finished, 6);
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 6; ++i) prompt_tokens += static_cast<int64_t>(prompt(i).size());
  EXPECT_EQ(total.prompt_tokens_total, prompt_tokens);
  EXPECT_EQ(total.generation_tokens_total, 6 * 12);
  EXPECT_EQ(total.e2e_request_latency.count(), 6u);
  EXPECT_EQ(total.scheduler.num_running, 0);
  EXPECT_EQ(group.front().expert_counts(), (std::vector<int64_t>{1 + 2 + 3, 10 + 20 + 30}));
}

TEST(DataParallelRouterTest, MailOverOneAgreementsLimitWaitsForTheNext) {
  // Agreements carry at most 700 bytes from a rank here. Twelve requests submitted at once
  // need several agreements: each letter takes what fits and the rest waits, and the group
  // stays up. A request too large for any letter runs on rank 0's own engine.
  Group group(2, milliseconds(5000), 700);
  Collector collector;
  std::vector<RequestId> ids;
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(prompt(i + 20));  // 25..36 tokens
  std::vector<TokenId> huge;
  for (int k = 0; k < 200; ++k) huge.push_back(static_cast<TokenId>(k % kVocab));
  prompts.push_back(huge);
  for (const auto& p : prompts) {
    auto id = group.front().submit({p, greedy(4)}, collector.sink());
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    auto outputs = collector.wait(ids[i]);
    ASSERT_FALSE(outputs.empty()) << "request " << i << " never finished";
    EXPECT_TRUE(outputs.back().error.ok()) << outputs.back().error.to_string();
    EXPECT_EQ(tokens_of(outputs), reference_generate(prompts[i], 4, kVocab, std::nullopt))
        << "request " << i;
  }
  EXPECT_FALSE(group.front().done()) << "the group broke";
  const std::vector<int64_t> routed = group.front().routed_total();
  EXPECT_GE(routed[1], 5);  // rank 1 got its share by mail
  EXPECT_GE(routed[0], 1);  // the huge one among rank 0's
}

TEST(DataParallelRouterTest, LeastLoadedCountsChoicesAndFinishedRequests) {
  Group group(2);
  Collector collector;
  GenerationParams four = greedy(4);
  four.n = 4;
  auto a = group.front().submit({prompt(1), four}, collector.sink());       // rank 0: 4 sequences
  auto b = group.front().submit({prompt(2), greedy(4)}, collector.sink());  // rank 1
  auto c = group.front().submit({prompt(3), greedy(4)}, collector.sink());  // rank 1 (1 < 4)
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(group.front().routed_total(), (std::vector<int64_t>{1, 2}));
  for (RequestId id : {*a, *b, *c}) ASSERT_FALSE(collector.wait(id).empty());
  auto outputs = collector.wait(*a);
  for (int32_t choice = 0; choice < 4; ++choice) {
    EXPECT_EQ(tokens_of(outputs, choice), reference_generate(prompt(1), 4, kVocab, std::nullopt));
  }
  // All finished: the next goes to rank 0 again (ties: lowest rank).
  auto d = group.front().submit({prompt(4), greedy(2)}, collector.sink());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(group.front().routed_total(), (std::vector<int64_t>{2, 2}));
  ASSERT_FALSE(collector.wait(*d).empty());
}

TEST(DataParallelRouterTest, NoRankRefusesARequestRankZeroAccepted) {
  // Queues of 2. Rank 0 runs a request of 2 sequences, so rank 1 is the least loaded for
  // the next 2; while rank 0's engine is inside a step, a burst of 8 requests reaches rank 1
  // as one letter. Before ranks counted their room, rank 1 got 4 of them (2, then one after
  // each that rank 0's queue took) and its engine refused 2 after rank 0 had accepted them.
  // Now each request of the burst is refused at once (429) or runs to its end.
  Group group(2, milliseconds(5000), 0, {}, 2);
  Collector collector;
  GenerationParams two = greedy(200);  // still running when rank 0 is held below
  two.ignore_eos = true;
  two.n = 2;
  auto busy = group.front().submit({prompt(0), two}, collector.sink());
  ASSERT_TRUE(busy.ok()) << busy.status().to_string();
  ASSERT_TRUE(collector.wait_first(*busy));
  group.executor(0).hold(true);
  for (int i = 0; i < 2000 && !group.executor(0).holding(); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(group.executor(0).holding());
  std::vector<RequestId> accepted;
  std::vector<int> accepted_index;
  for (int i = 1; i <= 8; ++i) {
    auto id = group.front().submit({prompt(i), greedy(8)}, collector.sink());
    if (!id.ok()) {
      EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted) << id.status().to_string();
      continue;
    }
    accepted.push_back(*id);
    accepted_index.push_back(i);
  }
  group.executor(0).hold(false);
  EXPECT_GE(group.front().routed_total()[1], 2);
  for (size_t a = 0; a < accepted.size(); ++a) {
    auto outputs = collector.wait(accepted[a]);
    ASSERT_FALSE(outputs.empty()) << "request " << accepted_index[a] << " never finished";
    EXPECT_TRUE(outputs.back().error.ok())
        << "request " << accepted_index[a] << ": " << outputs.back().error.to_string();
    EXPECT_EQ(tokens_of(outputs),
              reference_generate(prompt(accepted_index[a]), 8, kVocab, std::nullopt))
        << "request " << accepted_index[a];
  }
  ASSERT_FALSE(collector.wait(*busy).empty());
  EXPECT_EQ(group.front().outstanding(), (std::vector<int64_t>{0, 0}));
}

TEST(DataParallelRouterTest, BadRequestsAreRefusedAtOnce) {
  Group group(2);
  Collector collector;
  auto empty = group.front().submit({{}, greedy(3)}, collector.sink());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  auto outside = group.front().submit({{1, kVocab + 5}, greedy(3)}, collector.sink());
  EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
  auto too_long = group.front().submit({prompt(1), greedy(1000)}, collector.sink());
  EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(group.front().routed_total(), (std::vector<int64_t>{0, 0}));
  // Followers do not take requests of their own.
  EXPECT_EQ(group.router(1).submit({prompt(1), greedy(3)}, collector.sink()).status().code(),
            StatusCode::kUnavailable);
}

TEST(DataParallelRouterTest, AbortReachesTheOwningRank) {
  Group group(2);
  Collector collector;
  GenerationParams endless = greedy(200);
  endless.ignore_eos = true;
  auto local = group.front().submit({prompt(1), endless}, collector.sink());   // rank 0
  auto remote = group.front().submit({prompt(2), endless}, collector.sink());  // rank 1
  ASSERT_TRUE(local.ok() && remote.ok());
  ASSERT_TRUE(collector.wait_first(*local));
  ASSERT_TRUE(collector.wait_first(*remote));
  group.front().abort(*remote);
  group.front().abort(*local);
  for (RequestId id : {*local, *remote}) {
    auto outputs = collector.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_EQ(finish_of(outputs), FinishReason::kAbort);
    EXPECT_LT(tokens_of(outputs).size(), 200u);
  }
  EXPECT_EQ(group.front().outstanding(), (std::vector<int64_t>{0, 0}));
  // The follower's engine freed the request (its KV blocks with it).
  for (int i = 0; i < 400 && group.engine(1).metrics().scheduler.num_running > 0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(group.engine(1).metrics().scheduler.num_running, 0);
}

TEST(DataParallelRouterTest, FinishEndsRemoteRequestsAndStopsTheGroup) {
  Group group(3);
  Collector collector;
  GenerationParams endless = greedy(200);
  endless.ignore_eos = true;
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(group.front().submit({prompt(i), endless}, collector.sink()).value());
  for (RequestId id : ids) ASSERT_TRUE(collector.wait_first(id));
  group.engine(0).stop();
  ASSERT_TRUE(group.front().finish().ok());
  for (RequestId id : ids) {
    auto outputs = collector.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_EQ(finish_of(outputs), FinishReason::kAbort);
  }
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(group.router(r).wait_until_done().ok()) << "rank " << r;
  EXPECT_EQ(group.front().submit({prompt(1), greedy(2)}, collector.sink()).status().code(),
            StatusCode::kUnavailable);
}

// Three long requests through the front end, each past its first output.
std::vector<RequestId> start_long_requests(Group& group, Collector& collector) {
  GenerationParams endless = greedy(200);
  endless.ignore_eos = true;
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(group.front().submit({prompt(i), endless}, collector.sink()).value());
  for (RequestId id : ids) EXPECT_TRUE(collector.wait_first(id));
  return ids;
}

// Outputs in rank 1's mail for a choice the request does not have (or for a request that
// rank does not host) are a corrupt rank: the group ends with an error naming it, and nothing
// reaches the request's sink (whose choice arrays such an index would overrun).
TEST(DataParallelRouterTest, OutputsForAChoiceOutsideTheRequestBreakTheGroup) {
  auto shift_choices = [](dist::StepAgreement* agreement) {
    if (agreement->mail.size() < 2 || agreement->mail[1].empty()) return;
    ByteReader in(agreement->mail[1]);
    std::vector<std::byte> rewritten;
    ByteWriter out(&rewritten);
    const uint64_t count = in.get_count(sizeof(uint64_t));
    out.put<uint64_t>(count);
    for (uint64_t i = 0; i < count && in.ok(); ++i) {
      out.put<uint64_t>(in.get<uint64_t>());
      Result<RequestOutput> output = decode_output(in);
      if (!output.ok()) return;
      for (ChoiceDelta& choice : output->choices) choice.index += 5;
      encode_output(*output, out);
    }
    agreement->mail[1] = std::move(rewritten);
  };
  Group group(2, milliseconds(300), 0, shift_choices);
  Collector collector;
  GenerationParams endless = greedy(200);
  endless.ignore_eos = true;
  std::vector<RequestId> ids;
  for (int i = 0; i < 2; ++i) {
    ids.push_back(group.front().submit({prompt(i), endless}, collector.sink()).value());
  }
  // Bounded: without the check the group would go on for ever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!group.front().done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_TRUE(group.front().done()) << "the group went on with a corrupt rank";
  const Status front = group.front().wait_until_done();
  EXPECT_EQ(front.code(), StatusCode::kDataLoss) << front.to_string();
  EXPECT_NE(front.message().find("rank 1"), std::string::npos) << front.message();
  EXPECT_NE(front.message().find("choice 5 of 1"), std::string::npos) << front.message();
  for (RequestId id : ids) {
    auto outputs = collector.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_EQ(finish_of(outputs), FinishReason::kError);
    for (const RequestOutput& out : outputs) {
      for (const ChoiceDelta& d : out.choices) EXPECT_EQ(d.index, 0);
    }
  }
}

TEST(DataParallelRouterTest, LostRankIsAnErrorEverywhereNeverAHang) {
  Group group(3, milliseconds(300));
  Collector collector;
  const std::vector<RequestId> ids = start_long_requests(group, collector);
  group.engine(2).stop();  // rank 2 is gone: it never agrees again
  Status front = group.front().wait_until_done();
  EXPECT_EQ(front.code(), StatusCode::kUnavailable) << front.to_string();
  EXPECT_NE(front.message().find("rank 2"), std::string::npos) << front.message();
  EXPECT_FALSE(group.router(1).wait_until_done().ok());
  for (RequestId id : ids) {
    auto outputs = collector.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_EQ(finish_of(outputs), FinishReason::kError);
    EXPECT_FALSE(outputs.back().error.ok());
  }
  EXPECT_FALSE(group.front().running());
  EXPECT_EQ(group.front().submit({prompt(1), greedy(2)}, collector.sink()).status().code(),
            StatusCode::kUnavailable);
}

TEST(DataParallelRouterTest, AStepThatFailsOnOneRankEndsTheGroupNeverAHang) {
  // The failed rank skipped that step's exchanges while the others waited for it, so the
  // ranks' step counters disagree from then on: the group ends, as when a rank is lost,
  // instead of stepping on out of lock-step.
  Group group(3, milliseconds(300));
  Collector collector;
  const std::vector<RequestId> ids = start_long_requests(group, collector);
  group.executor(2).fail_next(1);
  // Bounded: without the group ending, rank 2's router would wait for ever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!group.router(2).done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_TRUE(group.router(2).done()) << "rank 2 went on after its step failed";
  const Status failed = group.router(2).wait_until_done();
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.to_string();
  EXPECT_NE(failed.message().find("injected executor failure"), std::string::npos)
      << failed.message();
  EXPECT_FALSE(group.front().wait_until_done().ok());
  EXPECT_FALSE(group.router(1).wait_until_done().ok());
  for (RequestId id : ids) {
    auto outputs = collector.wait(id);
    ASSERT_FALSE(outputs.empty());
    EXPECT_EQ(finish_of(outputs), FinishReason::kError);
  }
  EXPECT_EQ(group.front().submit({prompt(1), greedy(2)}, collector.sink()).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(group.engine(2).submit({prompt(1), greedy(2)}, collector.sink()).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace peerserve
