// The two-microbatch pipeline: where a step splits, bitwise equality with the one-batch
// forward, the interleaving of the two microbatches' expert exchanges, a collective
// backend's empty second microbatch, switching when an exchange is not ready, and errors.
#include "runtime/microbatch_pipeline.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/checkpoint/test_model.h"
#include "model/deepseek_model.h"
#include "model/expert_backend.h"

namespace peerserve {
namespace {

std::vector<int32_t> tokens_of(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 13 + salt * 29) % 250);
  return t;
}

TEST(MicrobatchSplitTest, SplitBalancesTheRowsOfWholeChunks) {
  const std::vector<int32_t> t = tokens_of(10, 0);
  auto chunk = [&](int n) {
    SequenceChunk c;
    c.tokens = std::span<const int32_t>(t).first(n);
    return c;
  };
  std::vector<SequenceChunk> decode{chunk(1), chunk(1), chunk(1), chunk(1)};
  EXPECT_EQ(microbatch_split_point(decode), 2u);
  std::vector<SequenceChunk> odd{chunk(1), chunk(1), chunk(1)};
  EXPECT_EQ(microbatch_split_point(odd), 2u);
  std::vector<SequenceChunk> prefill_first{chunk(8), chunk(1), chunk(1)};
  EXPECT_EQ(microbatch_split_point(prefill_first), 1u);
  std::vector<SequenceChunk> prefill_last{chunk(1), chunk(1), chunk(8)};
  EXPECT_EQ(microbatch_split_point(prefill_last), 2u);
  std::vector<SequenceChunk> one{chunk(5)};
  EXPECT_EQ(microbatch_split_point(one), 1u);
  EXPECT_EQ(microbatch_split_point({}), 0u);
}

// Delegates to the model's own backend; logs every stage call with its microbatch slot;
// can claim to be collective, to be not ready once per call, or to fail.
class LoggingBackend final : public ExpertBackend {
 public:
  explicit LoggingBackend(std::shared_ptr<ExpertBackend> inner) : inner_(std::move(inner)) {}
  struct SlotCall final : Call {
    int slot = 0;
    std::unique_ptr<Call> inner;
    mutable int not_ready_left = 0;
  };
  std::unique_ptr<Call> new_call(int slot) override {
    auto call = std::make_unique<SlotCall>();
    call->slot = slot;
    call->inner = inner_->new_call(slot);
    return call;
  }
  Status dispatch(const RoutedTokens& tokens, Call& c) override {
    auto& call = static_cast<SlotCall&>(c);
    log.push_back("d" + std::to_string(call.slot) + "L" + std::to_string(tokens.layer));
    call.not_ready_left = call.slot == not_ready_slot ? not_ready_per_call : 0;
    if (tokens.num_tokens == 0) ++empty_dispatches;
    return inner_->dispatch(tokens, *call.inner);
  }
  Status compute(Call& c) override {
    auto& call = static_cast<SlotCall&>(c);
    log.push_back("x" + std::to_string(call.slot));
    if (fail) return unavailable("peer rank 3 lost");
    call.not_ready_left = call.slot == not_ready_slot ? not_ready_per_call : 0;
    return inner_->compute(*call.inner);
  }
  Status combine(Call& c, std::span<float> out) override {
    auto& call = static_cast<SlotCall&>(c);
    log.push_back("c" + std::to_string(call.slot));
    return inner_->combine(*call.inner, out);
  }
  bool ready(const Call& c) const override {
    const auto& call = static_cast<const SlotCall&>(c);
    if (call.not_ready_left > 0) {
      --call.not_ready_left;
      return false;
    }
    return true;
  }
  bool collective() const override { return is_collective; }

  std::vector<std::string> log;
  int not_ready_per_call = 0;
  int not_ready_slot = 0;  // only this microbatch's exchanges are slow
  int empty_dispatches = 0;
  bool is_collective = false;
  bool fail = false;

 private:
  std::shared_ptr<ExpertBackend> inner_;
};

class MicrobatchPipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("peerserve_microbatch_" + std::to_string(::getpid())));
    TestModelOptions options;
    options.preset = TestModelPreset::kTiny;
    options.seed = 5;
    ASSERT_TRUE(write_test_model(dir_->string(), options).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    ModelOptions o;
    o.num_threads = 2;
    auto model = DeepseekModel::load(dir_->string(), o);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(model).value();
    logger_ = std::make_shared<LoggingBackend>(model_->expert_backend());
    model_->set_expert_backend(logger_);
    auto cache = LatentKvCache::create(model_->kv_layout(4, DType::kBF16), 64);
    ASSERT_TRUE(cache.ok());
    cache_ = std::make_unique<LatentKvCache>(std::move(cache).value());
  }

  // A mixed step: two sequences decode one token after a cached context, two prefill.
  void make_step() {
    tokens_ = {tokens_of(9, 1), tokens_of(6, 2), tokens_of(11, 3), tokens_of(3, 4)};
    blocks_ = {{0, 1, 2}, {3, 4}, {5, 6, 7}, {8}};
    const int64_t cached[4] = {8, 5, 0, 0};
    for (int i = 0; i < 2; ++i) {  // the decoders' contexts
      SequenceChunk c;
      c.tokens = std::span<const int32_t>(tokens_[i]).first(cached[i]);
      c.block_table = blocks_[i];
      ForwardOutput ignored;
      ASSERT_TRUE(model_->forward({&c, 1}, *cache_, &ignored).ok());
    }
    chunks_.clear();
    for (int i = 0; i < 4; ++i) {
      SequenceChunk c;
      c.tokens = std::span<const int32_t>(tokens_[i]).subspan(cached[i]);
      c.start_pos = cached[i];
      c.block_table = blocks_[i];
      c.all_logits = i == 2;
      chunks_.push_back(c);
    }
  }

  static std::filesystem::path* dir_;
  std::unique_ptr<DeepseekModel> model_;
  std::shared_ptr<LoggingBackend> logger_;
  std::unique_ptr<LatentKvCache> cache_;
  std::vector<std::vector<int32_t>> tokens_, blocks_;
  std::vector<SequenceChunk> chunks_;
};

std::filesystem::path* MicrobatchPipelineTest::dir_ = nullptr;

bool same_output(const ForwardOutput& a, const ForwardOutput& b) {
  auto eq = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  return eq(a.logits, b.logits) && eq(a.hidden, b.hidden) && a.row_offsets == b.row_offsets;
}

TEST_F(MicrobatchPipelineTest, EqualsOneBatchBitwiseAndInterleavesTheExchanges) {
  make_step();
  ForwardOutput one;
  ASSERT_TRUE(model_->forward(chunks_, *cache_, &one).ok());
  logger_->log.clear();

  MicrobatchPipeline pipeline(model_.get(), MicrobatchSplit::kAlways);
  ForwardOutput two;
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &two).ok());
  EXPECT_TRUE(same_output(one, two));
  EXPECT_EQ(pipeline.stats().split_steps, 1);

  // Per MoE layer, both microbatches have dispatched before either combines: the second's
  // attention and dispatch run while the first's experts are away.
  const std::vector<std::string>& log = logger_->log;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].rfind("d0", 0) != 0) continue;
    const std::string layer = log[i].substr(2);
    size_t d1 = std::find(log.begin() + i, log.end(), "d1" + layer) - log.begin();
    size_t c0 = std::find(log.begin() + i, log.end(), "c0") - log.begin();
    EXPECT_LT(d1, c0) << "layer " << layer;
  }
}

TEST_F(MicrobatchPipelineTest, SwitchesToTheOtherMicrobatchWhenAnExchangeIsNotReady) {
  make_step();
  ForwardOutput one;
  ASSERT_TRUE(model_->forward(chunks_, *cache_, &one).ok());
  logger_->not_ready_per_call = 1;
  MicrobatchPipeline pipeline(model_.get(), MicrobatchSplit::kAlways);
  ForwardOutput two;
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &two).ok());
  EXPECT_TRUE(same_output(one, two));
  EXPECT_GT(pipeline.stats().waits_avoided, 0);
}

TEST_F(MicrobatchPipelineTest, CollectiveBackendRunsAnEmptySecondMicrobatch) {
  logger_->is_collective = true;
  const std::vector<int32_t> t = tokens_of(5, 9), blocks{0, 1};
  SequenceChunk c;
  c.tokens = t;
  c.block_table = blocks;
  MicrobatchPipeline pipeline(model_.get());
  ForwardOutput out;
  ASSERT_TRUE(pipeline.forward({&c, 1}, *cache_, &out).ok());
  const ModelConfig& config = model_->config();
  EXPECT_EQ(logger_->empty_dispatches, config.num_hidden_layers - config.first_k_dense_replace);
  EXPECT_EQ(out.num_rows(), 1);
  // And a step with nothing at all still joins every exchange, in both slots.
  logger_->empty_dispatches = 0;
  ASSERT_TRUE(pipeline.forward({}, *cache_, &out).ok());
  EXPECT_EQ(logger_->empty_dispatches,
            2 * (config.num_hidden_layers - config.first_k_dense_replace));
  EXPECT_EQ(out.num_rows(), 0);
}

TEST_F(MicrobatchPipelineTest, AFailedExchangeFailsTheStepAndTheNextStepWorks) {
  make_step();
  MicrobatchPipeline pipeline(model_.get(), MicrobatchSplit::kAlways);
  ForwardOutput out;
  logger_->fail = true;
  const Status s = pipeline.forward(chunks_, *cache_, &out);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  logger_->fail = false;
  ForwardOutput again, one;
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &again).ok());
  ASSERT_TRUE(model_->forward(chunks_, *cache_, &one).ok());
  EXPECT_TRUE(same_output(one, again));
}

TEST_F(MicrobatchPipelineTest, TwoMicrobatchesWritingOneBlockAreRefused) {
  make_step();
  chunks_[3].block_table = blocks_[0];  // the fourth sequence writes the first's block 2
  chunks_[3].start_pos = 8;
  MicrobatchPipeline pipeline(model_.get(), MicrobatchSplit::kAlways);
  ForwardOutput out;
  EXPECT_EQ(pipeline.forward(chunks_, *cache_, &out).code(), StatusCode::kInvalidArgument);
  // Nothing was left half-way: the next step runs.
  make_step();
  EXPECT_TRUE(pipeline.forward(chunks_, *cache_, &out).ok());
}

}  // namespace
}  // namespace peerserve

namespace peerserve {
namespace {

// The measured policy, by the agreement a lock-step caller hands over: the leader's plan
// decides for the group's step size, split or whole, with the same rows either way; a
// collective backend without an agreement splits (every rank does the same).
TEST_F(MicrobatchPipelineTest, FollowsTheAgreedPlanForTheGroupsStepSize) {
  make_step();
  ForwardOutput one;
  ASSERT_TRUE(model_->forward(chunks_, *cache_, &one).ok());
  MicrobatchPipeline pipeline(model_.get());
  const int64_t group_tokens = 1000;  // other ranks bring most of the step
  const int bucket = MicrobatchPolicy::bucket_of(group_tokens);
  ForwardOutput out;
  pipeline.follow_agreement(uint64_t{1} << bucket, group_tokens);
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &out).ok());
  EXPECT_TRUE(same_output(one, out));
  EXPECT_EQ(pipeline.stats().split_steps, 1);
  pipeline.follow_agreement(~(uint64_t{1} << bucket), group_tokens);
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &out).ok());
  EXPECT_TRUE(same_output(one, out));
  EXPECT_EQ(pipeline.stats().split_steps, 1);
  EXPECT_EQ(pipeline.stats().whole_steps, 1);
  // Both timings went to the group size's bucket.
  EXPECT_EQ(pipeline.policy().samples(bucket, true), 1);
  EXPECT_EQ(pipeline.policy().samples(bucket, false), 1);

  logger_->is_collective = true;
  ASSERT_TRUE(pipeline.forward(chunks_, *cache_, &out).ok());
  EXPECT_EQ(pipeline.stats().split_steps, 2);
  EXPECT_TRUE(same_output(one, out));
}

// Without an agreement and with a local backend the pipeline asks its own policy: it tries
// both ways first, and `always` splits every step.
TEST_F(MicrobatchPipelineTest, MeasuredPolicyTriesBothWaysFirst) {
  make_step();
  MicrobatchPipeline measured(model_.get());
  MicrobatchPipeline always(model_.get(), MicrobatchSplit::kAlways);
  ForwardOutput out;
  for (int i = 0; i < 2 * MicrobatchPolicy::kWarmupSamples; ++i) {
    ASSERT_TRUE(measured.forward(chunks_, *cache_, &out).ok());
    ASSERT_TRUE(always.forward(chunks_, *cache_, &out).ok());
  }
  EXPECT_EQ(measured.stats().split_steps, MicrobatchPolicy::kWarmupSamples);
  EXPECT_EQ(measured.stats().whole_steps, MicrobatchPolicy::kWarmupSamples);
  EXPECT_EQ(always.stats().split_steps, 2 * MicrobatchPolicy::kWarmupSamples);
  EXPECT_EQ(always.stats().whole_steps, 0);
}

}  // namespace
}  // namespace peerserve
