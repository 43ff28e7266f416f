// Context caching through a shared caching pool (runtime/kv_pool_connector.h): two engines
// over one in-process pool, each with the paged fake model (whose KV blocks hold the token
// ids, so wrong or misplaced KV changes every later token). A prompt computed by engine A
// is a pool hit on engine B, with the same tokens; another namespace root never matches;
// aborting a loading request and a dead pool are handled.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cache/block_stream_server.h"
#include "cache/pool_client.h"
#include "runtime/engine.h"
#include "runtime/kv_handoff_receiver.h"
#include "runtime/kv_pool_connector.h"
#include "tests/cache/block_test_util.h"
#include "tests/runtime/fake_executor.h"

namespace peerserve {
namespace {

using testing::reference_generate;

constexpr int32_t kVocab = 50;
constexpr int32_t kBlock = 4;

class Collector {
 public:
  EngineClient::OutputSink sink() {
    return [this](RequestOutput out) {
      std::lock_guard<std::mutex> lock(mutex_);
      outputs_[out.request_id].push_back(std::move(out));
      cv_.notify_all();
    };
  }
  std::vector<RequestOutput> wait(RequestId id) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      auto it = outputs_.find(id);
      return it != outputs_.end() && it->second.back().finished;
    });
    return done ? outputs_[id] : std::vector<RequestOutput>{};
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<RequestId, std::vector<RequestOutput>> outputs_;
};

std::vector<TokenId> tokens_of(const std::vector<RequestOutput>& outputs) {
  std::vector<TokenId> tokens;
  for (const RequestOutput& out : outputs) {
    for (const ChoiceDelta& d : out.choices) {
      tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  return tokens;
}

std::shared_ptr<KvBlockStore> local_pool() {
  TieredBlockStoreOptions store;
  store.dram_bytes = 1 << 20;
  auto client = PoolClient::open_local(store, PoolClientOptions{});
  PS_CHECK(client.ok()) << client.status().to_string();
  return std::shared_ptr<KvBlockStore>(std::move(client).value());
}

std::unique_ptr<Engine> make_engine(
    std::shared_ptr<KvBlockStore> pool, BlockHash root,
    testing::FakeExecutor** executor_out = nullptr,
    std::function<Status(std::span<const TokenId>, const KvPushTarget*, const std::string&,
                         const std::string&)>
        remote_prefill = {},
    std::shared_ptr<KvHandoffReceiver> handoff = nullptr, std::string handoff_endpoint = {},
    std::chrono::milliseconds handoff_wait = std::chrono::milliseconds(1000)) {
  EngineOptions options;
  options.scheduler.max_num_seqs = 8;
  options.scheduler.max_num_batched_tokens = 64;
  options.scheduler.max_model_len = 256;
  options.scheduler.block_pool = {
      .num_blocks = 96, .block_size = kBlock, .enable_prefix_caching = true};
  options.scheduler.prefix_root = root;
  options.vocab_size = kVocab;
  options.kv_pool = std::move(pool);
  options.kv_pool_options.tenant = "test";
  options.kv_pool_options.remote_prefill = std::move(remote_prefill);
  options.kv_pool_options.workers = 2;
  options.kv_pool_options.handoff = std::move(handoff);
  options.kv_pool_options.handoff_endpoint = std::move(handoff_endpoint);
  options.kv_pool_options.handoff_wait = handoff_wait;
  auto executor = std::make_unique<testing::FakeExecutor>(96, kBlock, kVocab);
  if (executor_out) *executor_out = executor.get();
  auto engine = Engine::create(options, std::move(executor), nullptr);
  PS_CHECK(engine.ok()) << engine.status().to_string();
  (*engine)->start();
  return std::move(engine).value();
}

GenerationParams greedy(int32_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<TokenId> long_prompt(int salt) {
  std::vector<TokenId> p;
  for (int i = 0; i < 41; ++i) p.push_back(static_cast<TokenId>((i * 13 + salt) % kVocab));
  return p;
}

// Metrics settle after the step that produced the last output: poll briefly.
EngineMetricsSnapshot metrics_when(Engine& engine,
                                   const std::function<bool(const EngineMetricsSnapshot&)>& ok) {
  EngineMetricsSnapshot m = engine.metrics();
  for (int i = 0; i < 400 && !ok(m); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = engine.metrics();
  }
  return m;
}

TEST(EngineKvPoolTest, APromptComputedByOneEngineIsAPoolHitOnAnother) {
  auto pool = local_pool();
  const BlockHash root = root_block_hash("test-namespace");
  auto a = make_engine(pool, root);
  auto b = make_engine(pool, root);
  Collector collector;
  const auto prompt = long_prompt(1);
  const auto want = reference_generate(prompt, 6, kVocab, std::nullopt);

  auto first = a->submit({prompt, greedy(6)}, collector.sink());
  ASSERT_TRUE(first.ok());
  auto out_a = collector.wait(*first);
  ASSERT_FALSE(out_a.empty());
  EXPECT_EQ(tokens_of(out_a), want);
  // A stored the prompt's 10 full blocks (the 11th block is partial).
  auto ma = metrics_when(*a, [](const auto& m) { return m.kv_pool.blocks_stored >= 10; });
  EXPECT_EQ(ma.kv_pool.blocks_stored, 10);
  EXPECT_EQ(ma.kv_pool_hit_tokens, 0);

  // Give the background writes a moment to land (they are asynchronous).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Collector collector_b;  // request ids are per engine
  auto second = b->submit({prompt, greedy(6)}, collector_b.sink());
  ASSERT_TRUE(second.ok());
  auto out_b = collector_b.wait(*second);
  ASSERT_FALSE(out_b.empty());
  EXPECT_EQ(tokens_of(out_b), want);  // the loaded KV is the right KV
  // (41 - 1) / 4 = 10 blocks may be shared: all came from the pool.
  EXPECT_EQ(out_b.back().usage.cached_prompt_tokens, 40);
  auto mb = b->metrics();
  EXPECT_EQ(mb.kv_pool_hit_tokens, 40);
  EXPECT_EQ(mb.kv_pool.blocks_hit, 10);
  EXPECT_EQ(mb.kv_pool_load_latency.count(), 1u);
  // B found everything in the pool, so it computed only the last token of the prompt.
  EXPECT_EQ(mb.scheduler.pool.prefix_hit_tokens, 40);
}

TEST(EngineKvPoolTest, AnotherNamespaceNeverMatches) {
  auto pool = local_pool();
  auto a = make_engine(pool, root_block_hash("model-one"));
  auto b = make_engine(pool, root_block_hash("model-two"));
  Collector collector;
  const auto prompt = long_prompt(2);
  auto first = a->submit({prompt, greedy(3)}, collector.sink());
  ASSERT_FALSE(collector.wait(*first).empty());
  metrics_when(*a, [](const auto& m) { return m.kv_pool.blocks_stored >= 10; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Collector collector_b;  // request ids are per engine
  auto second = b->submit({prompt, greedy(3)}, collector_b.sink());
  auto out_b = collector_b.wait(*second);
  ASSERT_FALSE(out_b.empty());
  EXPECT_EQ(tokens_of(out_b), reference_generate(prompt, 3, kVocab, std::nullopt));
  EXPECT_EQ(out_b.back().usage.cached_prompt_tokens, 0);
  EXPECT_EQ(b->metrics().kv_pool.blocks_hit, 0);
}

// vLLM's cache_salt: blocks computed under one salt are found in the pool only by requests
// with the same salt, so usage.cached_tokens tells a client nothing of other clients' prompts.
TEST(EngineKvPoolTest, ACacheSaltSharesPoolBlocksOnlyWithTheSameSalt) {
  auto pool = local_pool();
  const BlockHash root = root_block_hash("salted");
  auto a = make_engine(pool, root);
  auto b = make_engine(pool, root);
  const auto prompt = long_prompt(3);
  const auto want = reference_generate(prompt, 3, kVocab, std::nullopt);
  auto run = [&](Engine& engine, const std::string& salt) {
    Collector collector;
    EngineRequest request{prompt, greedy(3)};
    request.cache_salt = salt;
    auto id = engine.submit(std::move(request), collector.sink());
    EXPECT_TRUE(id.ok());
    auto out = collector.wait(*id);
    EXPECT_FALSE(out.empty());
    EXPECT_EQ(tokens_of(out), want);
    return out.empty() ? int64_t{-1} : out.back().usage.cached_prompt_tokens;
  };
  EXPECT_EQ(run(*a, "alice"), 0);
  metrics_when(*a, [](const auto& m) { return m.kv_pool.blocks_stored >= 10; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(run(*b, "bob"), 0);  // another salt: nothing shared, locally or in the pool
  EXPECT_EQ(run(*b, ""), 0);     // no salt is a salt of its own
  auto mb = b->metrics();
  EXPECT_EQ(mb.kv_pool.blocks_hit, 0);
  EXPECT_EQ(run(*b, "alice"), 40);  // the same salt: every shareable block from the pool
  EXPECT_EQ(b->metrics().kv_pool.blocks_hit, 10);
}

TEST(EngineKvPoolTest, PartialHitsLoadTheLeadingRunAndComputeTheRest) {
  auto pool = local_pool();
  const BlockHash root = root_block_hash("partial");
  auto a = make_engine(pool, root);
  auto b = make_engine(pool, root);
  Collector collector;
  // A computes a 21-token prompt (5 full blocks); B asks for a 41-token prompt that starts
  // with it: 5 blocks from the pool, the rest computed.
  auto prompt = long_prompt(3);
  std::vector<TokenId> head(prompt.begin(), prompt.begin() + 21);
  auto first = a->submit({head, greedy(2)}, collector.sink());
  ASSERT_FALSE(collector.wait(*first).empty());
  metrics_when(*a, [](const auto& m) { return m.kv_pool.blocks_stored >= 5; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Collector collector_b;  // request ids are per engine
  auto second = b->submit({prompt, greedy(5)}, collector_b.sink());
  auto out_b = collector_b.wait(*second);
  ASSERT_FALSE(out_b.empty());
  EXPECT_EQ(tokens_of(out_b), reference_generate(prompt, 5, kVocab, std::nullopt));
  EXPECT_EQ(out_b.back().usage.cached_prompt_tokens, 20);
  EXPECT_EQ(b->metrics().kv_pool.blocks_hit, 5);
}

// A store whose every call fails as if its member were down.
class DeadPool final : public KvBlockStore {
 public:
  std::vector<BlockLookup> get(std::span<const PoolKey> keys, std::span<const BlockSink>,
                               std::chrono::milliseconds) override {
    ++gets;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow timeout
    return std::vector<BlockLookup>(keys.size(), BlockLookup::miss());
  }
  std::vector<Status> put(std::span<const PoolKey> keys,
                          std::span<const std::span<const std::byte>>,
                          std::chrono::milliseconds) override {
    return std::vector<Status>(keys.size(), unavailable("down"));
  }
  std::vector<std::optional<uint64_t>> exists(std::span<const PoolKey> keys,
                                              std::chrono::milliseconds) override {
    return std::vector<std::optional<uint64_t>>(keys.size());
  }
  std::vector<bool> remove(std::span<const PoolKey> keys, std::chrono::milliseconds) override {
    return std::vector<bool>(keys.size(), false);
  }
  std::future<std::vector<BlockLookup>> get_async(std::vector<PoolKey> keys,
                                                  std::vector<BlockSink> sinks,
                                                  std::chrono::milliseconds t) override {
    std::promise<std::vector<BlockLookup>> p;
    p.set_value(get(keys, sinks, t));
    return p.get_future();
  }
  std::future<std::vector<Status>> put_async(std::vector<PoolKey> keys,
                                             std::vector<std::vector<std::byte>>,
                                             std::chrono::milliseconds) override {
    std::promise<std::vector<Status>> p;
    p.set_value(std::vector<Status>(keys.size(), unavailable("down")));
    return p.get_future();
  }
  std::atomic<int> gets{0};
};

TEST(EngineKvPoolTest, ADeadPoolIsAMissAndStoreFailuresAreCounted) {
  auto dead = std::make_shared<DeadPool>();
  auto engine = make_engine(dead, root_block_hash("dead"));
  Collector collector;
  const auto prompt = long_prompt(4);
  auto id = engine->submit({prompt, greedy(4)}, collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 4, kVocab, std::nullopt));
  EXPECT_EQ(dead->gets.load(), 1);
  auto m = metrics_when(*engine, [](const auto& s) { return s.kv_pool.store_failures >= 10; });
  EXPECT_EQ(m.kv_pool.blocks_stored, 10);
  EXPECT_EQ(m.kv_pool.store_failures, 10);
}

TEST(EngineKvPoolTest, AbortWhileLoadingEndsTheRequest) {
  auto dead = std::make_shared<DeadPool>();
  auto engine = make_engine(dead, root_block_hash("abort"));
  Collector collector;
  auto id = engine->submit({long_prompt(5), greedy(4)}, collector.sink());
  ASSERT_TRUE(id.ok());
  engine->abort(*id);  // most likely still loading (the lookup takes 20 ms)
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  ASSERT_FALSE(out.back().choices.empty());
  EXPECT_EQ(out.back().choices.back().finish_reason, FinishReason::kAbort);
  // The engine still works.
  auto next = engine->submit({long_prompt(6), greedy(2)}, collector.sink());
  EXPECT_FALSE(collector.wait(*next).empty());
}

TEST(EngineKvPoolTest, RemotePrefillHandsTheKvOverThroughThePool) {
  // Disaggregated: engine P (prefill role) computes prompts on request; engine D (decode
  // role) asks P for the prompts it misses and reads their blocks from the pool.
  auto pool = local_pool();
  const BlockHash root = root_block_hash("disaggregated");
  auto prefill = make_engine(pool, root);
  std::atomic<int> remote_calls{0};
  std::atomic<bool> fail_remote{false};
  std::string last_hint;  // what the request said about its prefill instance
  auto remote = [&](std::span<const TokenId> prompt, const KvPushTarget* push,
                    const std::string& hint, const std::string& cache_salt) -> Status {
    EXPECT_EQ(push, nullptr);  // no hand-off receiver: through the pool
    last_hint = hint;
    ++remote_calls;
    if (fail_remote) return unavailable("prefill instance down");
    Collector c;
    EngineRequest request{std::vector<TokenId>(prompt.begin(), prompt.end()), greedy(1)};
    request.cache_salt = cache_salt;
    auto id = prefill->submit(std::move(request), c.sink());
    if (!id.ok()) return id.status();
    return c.wait(*id).empty() ? unavailable("prefill timed out") : ok_status();
  };
  auto decode = make_engine(pool, root, nullptr, remote);
  Collector collector;
  const auto prompt = long_prompt(7);
  auto id = decode->submit({prompt, greedy(6)}, collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 6, kVocab, std::nullopt));
  EXPECT_EQ(remote_calls.load(), 1);
  EXPECT_EQ(last_hint, "");
  EXPECT_EQ(out.back().usage.cached_prompt_tokens, 40);  // every shareable block handed over
  auto m = decode->metrics();
  EXPECT_EQ(m.kv_pool.remote_prefills, 1);
  EXPECT_EQ(m.kv_pool.remote_prefill_failures, 0);
  EXPECT_EQ(m.kv_pool_hit_tokens, 40);

  // A failing prefill instance: the decode instance computes the prompt itself.
  fail_remote = true;
  const auto other = long_prompt(8);
  EngineRequest hinted{other, greedy(4)};
  hinted.prefill_hint = "10.0.0.7:8100";  // a router's choice reaches the remote prefill call
  auto id2 = decode->submit(hinted, collector.sink());
  auto out2 = collector.wait(*id2);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(tokens_of(out2), reference_generate(other, 4, kVocab, std::nullopt));
  EXPECT_EQ(out2.back().usage.cached_prompt_tokens, 0);
  EXPECT_EQ(decode->metrics().kv_pool.remote_prefill_failures, 1);
  EXPECT_EQ(last_hint, "10.0.0.7:8100");
}

// The decode role with a hand-off receiver (paper 000 §4.3.3): the prefill engine pushes the
// prompt's blocks over the block stream straight into the blocks the decode engine reserved.
// The two engines use separate pools, so the blocks can only arrive by the push.
class DirectHandoff {
 public:
  explicit DirectHandoff(std::chrono::milliseconds handoff_wait = std::chrono::milliseconds(1000))
      : root_(root_block_hash("direct")), prefill_(make_engine(local_pool(), root_)) {
    receiver_ = std::make_shared<KvHandoffReceiver>();
    auto server = BlockStreamServer::start(receiver_, BlockStreamServerOptions{});
    PS_CHECK(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    auto remote = [this](std::span<const TokenId> prompt, const KvPushTarget* push,
                         const std::string& /*hint*/, const std::string& cache_salt) -> Status {
      ++calls;
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      if (fail) return unavailable("prefill instance down");
      EngineRequest request{std::vector<TokenId>(prompt.begin(), prompt.end()), greedy(1)};
      request.cache_salt = cache_salt;
      EXPECT_NE(push, nullptr);
      if (push != nullptr && !withhold_push) request.kv_push = *push;
      Collector c;
      auto id = prefill_->submit(std::move(request), c.sink());
      if (!id.ok()) return id.status();
      return c.wait(*id).empty() ? unavailable("prefill timed out") : ok_status();
    };
    decode_ = make_engine(local_pool(), root_, nullptr, remote, receiver_,
                          "127.0.0.1:" + std::to_string(server_->port()), handoff_wait);
  }
  ~DirectHandoff() {
    decode_.reset();  // its loads close their transfers first
    server_->stop();
  }

  std::atomic<int> calls{0};
  std::atomic<bool> fail{false};
  std::atomic<bool> withhold_push{false};  // the prefill answers but pushes nothing
  std::chrono::milliseconds delay{0};
  Engine& decode() { return *decode_; }
  Engine& prefill() { return *prefill_; }
  KvHandoffReceiver& receiver() { return *receiver_; }

 private:
  BlockHash root_;
  std::unique_ptr<Engine> prefill_;
  std::shared_ptr<KvHandoffReceiver> receiver_;
  std::unique_ptr<BlockStreamServer> server_;
  std::unique_ptr<Engine> decode_;
};

TEST(EngineKvPoolTest, RemotePrefillPushesKvStraightIntoReservedBlocks) {
  DirectHandoff setup;
  Collector collector;
  const auto prompt = long_prompt(9);
  auto id = setup.decode().submit({prompt, greedy(6)}, collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 6, kVocab, std::nullopt));
  EXPECT_EQ(setup.calls.load(), 1);
  EXPECT_EQ(out.back().usage.cached_prompt_tokens, 40);  // all 10 shareable blocks pushed
  auto m =
      metrics_when(setup.decode(), [](const auto& s) { return s.scheduler.num_used_blocks == 0; });
  EXPECT_EQ(m.kv_pool.handoff_blocks, 10);
  EXPECT_EQ(m.kv_pool_hit_tokens, 40);
  EXPECT_EQ(m.scheduler.num_used_blocks, 0);  // reservations released into the prefix cache
  EXPECT_EQ(setup.receiver().counters().blocks_received, 10);
  EXPECT_EQ(setup.receiver().counters().transfers_complete, 1);
  auto p = metrics_when(setup.prefill(), [](const auto& s) { return s.kv_pool.pushes >= 1; });
  EXPECT_EQ(p.kv_pool.pushes, 1);
  EXPECT_EQ(p.kv_pool.push_blocks, 10);
  EXPECT_EQ(p.kv_pool.push_failures, 0);

  // A prompt sharing the first 5 blocks: only the other 5 are reserved and pushed.
  auto shared = prompt;
  for (size_t i = 20; i < shared.size(); ++i)
    shared[i] = static_cast<TokenId>((shared[i] + 7) % kVocab);
  auto id2 = setup.decode().submit({shared, greedy(3)}, collector.sink());
  auto out2 = collector.wait(*id2);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(tokens_of(out2), reference_generate(shared, 3, kVocab, std::nullopt));
  EXPECT_EQ(out2.back().usage.cached_prompt_tokens, 40);
  EXPECT_EQ(setup.receiver().counters().blocks_received, 15);
}

// The salt travels to the prefill instance: it hashes the pushed blocks under the same salted
// chain, so the decode instance's receiver accepts them.
TEST(EngineKvPoolTest, ASaltedRequestIsHandedOverUnderItsSalt) {
  DirectHandoff setup;
  Collector collector;
  const auto prompt = long_prompt(10);
  EngineRequest request{prompt, greedy(4)};
  request.cache_salt = "tenant-7";
  auto id = setup.decode().submit(std::move(request), collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 4, kVocab, std::nullopt));
  EXPECT_EQ(out.back().usage.cached_prompt_tokens, 40);
  EXPECT_EQ(setup.receiver().counters().blocks_received, 10);
  // The same prompt without the salt shares nothing with it (and is pushed again).
  auto id2 = setup.decode().submit({prompt, greedy(4)}, collector.sink());
  auto out2 = collector.wait(*id2);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(setup.calls.load(), 2);
  EXPECT_EQ(setup.receiver().counters().blocks_received, 20);
}

TEST(EngineKvPoolTest, ThePartialLastBlockIsPushedTooSoOnlyTheLastTokenIsComputedHere) {
  DirectHandoff setup;
  Collector collector;
  auto prompt = long_prompt(14);
  prompt.push_back(3);
  prompt.push_back(4);  // 43 tokens: 10 full blocks, then 2 tokens before the last one
  auto id = setup.decode().submit({prompt, greedy(6)}, collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 6, kVocab, std::nullopt));
  EXPECT_EQ(out.back().usage.cached_prompt_tokens, 42);
  EXPECT_EQ(setup.receiver().counters().blocks_received, 11);
  auto m =
      metrics_when(setup.decode(), [](const auto& s) { return s.scheduler.num_used_blocks == 0; });
  EXPECT_EQ(m.kv_pool.handoff_blocks, 10);  // full blocks (the partial one is not counted)
  EXPECT_EQ(m.scheduler.num_used_blocks, 0);
  // With n = 2 the partial block is not pushed (both choices would write into it).
  GenerationParams two = greedy(3);
  two.n = 2;
  auto other = long_prompt(15);
  other.push_back(5);
  other.push_back(6);
  auto id2 = setup.decode().submit({other, two}, collector.sink());
  auto out2 = collector.wait(*id2);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(out2.back().usage.cached_prompt_tokens, 40);
  EXPECT_EQ(setup.receiver().counters().blocks_received, 21);
}

TEST(EngineKvPoolTest, MissingOrFailedPushIsComputedLocallyAndFreesTheReservation) {
  DirectHandoff setup(std::chrono::milliseconds(200));
  Collector collector;
  // The prefill instance answers but never pushes: the decode engine waits handoff_wait,
  // then computes the prompt itself.
  setup.withhold_push = true;
  const auto prompt = long_prompt(11);
  auto id = setup.decode().submit({prompt, greedy(4)}, collector.sink());
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(tokens_of(out), reference_generate(prompt, 4, kVocab, std::nullopt));
  EXPECT_EQ(out.back().usage.cached_prompt_tokens, 0);
  // A prefill instance that fails: the same, counted as a failure.
  setup.withhold_push = false;
  setup.fail = true;
  const auto other = long_prompt(12);
  auto id2 = setup.decode().submit({other, greedy(4)}, collector.sink());
  auto out2 = collector.wait(*id2);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(tokens_of(out2), reference_generate(other, 4, kVocab, std::nullopt));
  auto m =
      metrics_when(setup.decode(), [](const auto& s) { return s.scheduler.num_used_blocks == 0; });
  EXPECT_EQ(m.kv_pool.remote_prefill_failures, 1);
  EXPECT_EQ(m.kv_pool.handoff_blocks, 0);
  EXPECT_EQ(m.scheduler.num_used_blocks, 0);  // nothing reserved is left behind
  EXPECT_EQ(setup.receiver().counters().transfers, 2);
}

TEST(EngineKvPoolTest, AbortWhileTheHandoffRunsFreesTheReservedBlocksAfterwards) {
  DirectHandoff setup;
  setup.delay = std::chrono::milliseconds(300);
  Collector collector;
  auto id = setup.decode().submit({long_prompt(13), greedy(4)}, collector.sink());
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The blocks are reserved while the prefill runs...
  EXPECT_EQ(setup.decode().metrics().scheduler.num_used_blocks, 10);
  setup.decode().abort(*id);
  auto out = collector.wait(*id);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back().choices.back().finish_reason, FinishReason::kAbort);
  // ...and stay reserved until the transfer is closed, then go back to the free list.
  auto m = metrics_when(setup.decode(), [&](const auto& s) {
    return s.scheduler.num_used_blocks == 0 && setup.receiver().counters().transfers_complete == 1;
  });
  EXPECT_EQ(m.scheduler.num_used_blocks, 0);
  // The engine still works, and the pushed-then-abandoned blocks were not published.
  const auto prompt = long_prompt(13);
  auto again = setup.decode().submit({prompt, greedy(4)}, collector.sink());
  auto out2 = collector.wait(*again);
  ASSERT_FALSE(out2.empty());
  EXPECT_EQ(tokens_of(out2), reference_generate(prompt, 4, kVocab, std::nullopt));
}

TEST(EngineKvPoolTest, AnAbortedLoadThatHasNotStartedNeverRunsAndFreesItsBlocksAtOnce) {
  // Two connector workers, three loads: the third waits for a worker. Aborted while it
  // waits, it must not run its remote prefill later, and its reserved blocks come back
  // without waiting for the two loads before it.
  DirectHandoff setup;
  setup.delay = std::chrono::milliseconds(600);
  Collector collector;
  std::vector<RequestId> ids;
  for (int salt : {21, 22, 23}) {
    auto id = setup.decode().submit({long_prompt(salt), greedy(2)}, collector.sink());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(setup.calls.load(), 2);  // the third is queued
  EXPECT_EQ(setup.decode().metrics().scheduler.num_used_blocks, 30);
  setup.decode().abort(ids[2]);
  auto aborted = collector.wait(ids[2]);
  ASSERT_FALSE(aborted.empty());
  EXPECT_EQ(aborted.back().choices.back().finish_reason, FinishReason::kAbort);
  // Freed while the two running loads still hold theirs.
  auto m =
      metrics_when(setup.decode(), [](const auto& s) { return s.scheduler.num_used_blocks <= 20; });
  EXPECT_EQ(m.scheduler.num_used_blocks, 20);
  EXPECT_EQ(m.kv_pool.loads_cancelled, 1);
  for (size_t i = 0; i < 2; ++i) {
    auto out = collector.wait(ids[i]);
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(tokens_of(out),
              reference_generate(long_prompt(21 + static_cast<int>(i)), 2, kVocab, std::nullopt));
  }
  EXPECT_EQ(setup.calls.load(), 2);  // the aborted prompt was never sent to a prefill instance
}

// Two long prompts whose direct hand-offs reserve every free block, then a short prompt
// that needs a block of its own: the scheduler can plan nothing until a hand-off ends. The
// engine used to take that empty plan for a bug and abort the process ("scheduler has work
// but planned an empty step"); it now waits for the loads, and all three finish right.
TEST(EngineKvPoolTest, BlocksHeldByLoadsInFlightAreWaitedForNotAnAbort) {
  DirectHandoff setup;
  setup.delay = std::chrono::milliseconds(1500);
  Collector collector;
  auto prompt_of = [](int n, int salt) {
    std::vector<TokenId> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 13 + salt) % kVocab));
    return p;
  };
  const std::vector<std::vector<TokenId>> prompts = {
      prompt_of(200, 31), prompt_of(200, 32), {1, 2, 3}};
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = setup.decode().submit({prompts[i], greedy(2)}, collector.sink());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    if (i == 1) {
      auto m = metrics_when(setup.decode(),
                            [](const auto& s) { return s.scheduler.num_used_blocks == 96; });
      ASSERT_EQ(m.scheduler.num_used_blocks, 96) << "the hand-offs did not reserve every block";
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto out = collector.wait(ids[i]);
    ASSERT_FALSE(out.empty()) << "request " << i;
    EXPECT_EQ(tokens_of(out), reference_generate(prompts[i], 2, kVocab, std::nullopt))
        << "request " << i;
  }
}

// Pool stores wait behind a push in flight. Behind a stalled push (a decode instance that
// does not answer) they piled up without bound, copies of every block, and then filled the
// pushes' own cap: the next push was dropped. Each now has its own cap.
TEST(EngineKvPoolTest, StoresBehindAStalledPushAreBoundedAndLeavePushesRoom) {
  int port = 0;
  const int listener = testing::loopback_listener(&port);  // accepts, never answers
  ASSERT_GE(listener, 0);
  KvPoolConnectorOptions options;
  options.tenant = "test";
  options.timeout = std::chrono::milliseconds(500);
  {
    KvPoolConnector connector(local_pool(), 64, options, [] {});
    const std::vector<std::vector<std::byte>> block(1, std::vector<std::byte>(64));
    const KvPushTarget target{.endpoint = "127.0.0.1:" + std::to_string(port), .transfer = "t"};
    connector.push(target, {1}, block);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the pusher is stuck on it
    for (int i = 0; i < 100; ++i) connector.store({static_cast<BlockHash>(100 + i)}, block);
    connector.push(target, {2}, block);
    const KvPoolCounters counters = connector.counters();
    EXPECT_EQ(counters.push_failures, 0) << "the second push was dropped";
    EXPECT_EQ(counters.store_failures, 100 - 64);
  }
  ::close(listener);
}

// Two decode instances' hand-off ports on loopback: `silent` accepts and never answers,
// `live` is a receiver with a transfer open for block hash 2 landing in `landing`.
struct SilentAndLiveDecodeInstances {
  SilentAndLiveDecodeInstances() {
    int port = 0;
    listener = testing::loopback_listener(&port);
    PS_CHECK(listener >= 0);
    auto started = BlockStreamServer::start(receiver, BlockStreamServerOptions{});
    PS_CHECK(started.ok()) << started.status().to_string();
    server = std::move(started).value();
    transfer = receiver->open({2}, {std::span<std::byte>(landing)});
    silent = {.endpoint = "127.0.0.1:" + std::to_string(port), .transfer = "t"};
    live = {.endpoint = "127.0.0.1:" + std::to_string(server->port()), .transfer = transfer};
  }
  ~SilentAndLiveDecodeInstances() {
    receiver->close(transfer);
    server->stop();
    ::close(listener);
  }
  static KvPoolConnectorOptions options() {  // the silent push ends after 3 s
    KvPoolConnectorOptions o;
    o.tenant = "test";
    o.timeout = std::chrono::milliseconds(3000);
    return o;
  }

  int listener = -1;
  std::shared_ptr<KvHandoffReceiver> receiver = std::make_shared<KvHandoffReceiver>();
  std::unique_ptr<BlockStreamServer> server;
  std::vector<std::byte> landing = std::vector<std::byte>(64);
  std::string transfer;
  KvPushTarget silent, live;
};

// The connector's counters once `done` holds of them (or after ~1.5 s).
KvPoolCounters counters_when(KvPoolConnector& connector,
                             const std::function<bool(const KvPoolCounters&)>& done) {
  KvPoolCounters counters = connector.counters();
  for (int i = 0; i < 300 && !done(counters); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    counters = connector.counters();
  }
  return counters;
}

// A decode instance that stops answering holds up only its own pushes: a push to another
// one queued behind it arrives while the first is still waiting for its timeout (one pusher
// thread made it wait out that timeout first).
TEST(EngineKvPoolTest, ASilentDecodeInstanceHoldsUpOnlyItsOwnPushes) {
  SilentAndLiveDecodeInstances decode;
  {
    KvPoolConnector connector(local_pool(), 64, decode.options(), [] {});
    std::vector<std::vector<std::byte>> block(1, std::vector<std::byte>(64, std::byte{7}));
    connector.push(decode.silent, {1}, block);
    connector.push(decode.live, {2}, block);
    EXPECT_EQ(decode.receiver->wait(decode.transfer,
                                    std::chrono::steady_clock::now() + std::chrono::seconds(2)),
              1u);
    // The sender's count follows the receiver's.
    const KvPoolCounters counters =
        counters_when(connector, [](const KvPoolCounters& c) { return c.push_blocks > 0; });
    EXPECT_EQ(counters.push_blocks, 1);
    EXPECT_EQ(counters.push_failures, 0) << "the live push went after the silent one's timeout";
    EXPECT_EQ(decode.landing[0], std::byte{7});
  }  // the silent instance's push ends by its timeout
}

// A silent decode instance fills only its share of the push queue (8), and once a push to it
// fails in transport the ones queued behind it are dropped at once: 70 pushes to it used to
// fill the whole queue (64), so a push to a healthy instance was dropped, and each queued
// push then waited out the timeout in turn.
TEST(EngineKvPoolTest, ASilentDecodeInstanceFillsOnlyItsShareOfThePushQueue) {
  SilentAndLiveDecodeInstances decode;
  const auto started = std::chrono::steady_clock::now();
  {
    KvPoolConnector connector(local_pool(), 64, decode.options(), [] {});
    std::vector<std::vector<std::byte>> block(1, std::vector<std::byte>(64, std::byte{9}));
    for (int i = 0; i < 70; ++i) {
      connector.push(decode.silent, {static_cast<BlockHash>(100 + i)}, block);
    }
    connector.push(decode.live, {2}, block);
    EXPECT_EQ(decode.receiver->wait(decode.transfer,
                                    std::chrono::steady_clock::now() + std::chrono::seconds(2)),
              1u);
    EXPECT_EQ(decode.landing[0], std::byte{9});
    const KvPoolCounters counters =
        counters_when(connector, [](const KvPoolCounters& c) { return c.push_blocks > 0; });
    EXPECT_EQ(counters.push_blocks, 1);
    EXPECT_GE(counters.push_failures, 70 - 1 - 8) << "pushes past the instance's share";
  }  // the silent push ends by its 3 s timeout; the 8 queued behind it are dropped then
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20))
      << "the queued pushes to the silent instance each waited out the timeout";
}

// A pool store waits for the pushes queued before it, not for those queued after it: a push
// to a silent decode instance queued after the store used to hold it until its timeout
// (with several decode instances some push is nearly always in flight: stores starved).
TEST(EngineKvPoolTest, AStoreDoesNotWaitForPushesQueuedAfterIt) {
  SilentAndLiveDecodeInstances decode;
  KvPoolConnector connector(local_pool(), 64, decode.options(), [] {});
  const std::vector<std::vector<std::byte>> block(1, std::vector<std::byte>(64, std::byte{7}));
  connector.push(decode.live, {2}, block);
  connector.store({100}, block);  // behind the live push
  connector.push(decode.silent, {1}, block);
  const KvPoolCounters counters =
      counters_when(connector, [](const KvPoolCounters& c) { return c.blocks_stored > 0; });
  EXPECT_EQ(counters.blocks_stored, 1);
  EXPECT_EQ(counters.push_failures, 0) << "the store waited for the silent push queued after it";
}

TEST(EngineKvPoolTest, ConfigurationErrorsAreRefused) {
  auto pool = local_pool();
  EngineOptions options;
  options.scheduler.block_pool = {.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true};
  options.kv_pool = pool;
  // The engine-private root would mix engines' chains with unrelated ones.
  auto engine =
      Engine::create(options, std::make_unique<testing::FakeExecutor>(8, 4, kVocab), nullptr);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  options.scheduler.prefix_root = root_block_hash("x");
  options.scheduler.block_pool.enable_prefix_caching = false;
  engine = Engine::create(options, std::make_unique<testing::FakeExecutor>(8, 4, kVocab), nullptr);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  // One source of truth for the KV geometry: a scheduler block size that differs from the
  // executor's cache is refused, pool or not.
  EngineOptions plain;
  plain.scheduler.block_pool = {.num_blocks = 8, .block_size = 8, .enable_prefix_caching = true};
  engine = Engine::create(plain, std::make_unique<testing::FakeExecutor>(8, 4, kVocab), nullptr);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("block size"), std::string::npos);
}

}  // namespace
}  // namespace peerserve
