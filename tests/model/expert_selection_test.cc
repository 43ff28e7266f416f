// Loading only some routed experts (expert parallelism: each rank its share), in any order
// and with copies, and the local backend's logical -> held mapping: a model whose experts
// are split over two backends gives bitwise the logits of the whole model.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "kernels/vector_ops.h"
#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/local_expert_backend.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::load_model;
using testing::make_cache;
using testing::test_tokens;
using testing::tiny_checkpoint_dir;

ModelOptions options_with(std::function<std::vector<int32_t>(int64_t)> select) {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kBf16;
  o.routed_experts = std::move(select);
  return o;
}

std::vector<float> prefill_logits(DeepseekModel& model, const std::vector<int32_t>& tokens,
                                  Status* status = nullptr) {
  const std::vector<int32_t> blocks{0, 1};
  SequenceChunk chunk;
  chunk.tokens = tokens;
  chunk.block_table = blocks;
  chunk.all_logits = true;
  LatentKvCache cache = make_cache(model, 8, DType::kBF16, 2);
  ForwardOutput out;
  const Status s = model.forward({&chunk, 1}, cache, &out);
  if (status != nullptr) *status = s;
  return out.logits;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ExpertSelectionTest, PermutedAndDuplicatedExpertsGiveTheSameLogitsBitwise) {
  auto whole = load_model(tiny_checkpoint_dir(), options_with({}));
  const int32_t n = static_cast<int32_t>(whole->config().n_routed_experts);
  const std::vector<int32_t> tokens = test_tokens(12, whole->config().vocab_size, 4);
  const std::vector<float> reference = prefill_logits(*whole, tokens);

  auto reversed = load_model(tiny_checkpoint_dir(), options_with([n](int64_t) {
                               std::vector<int32_t> ids;
                               for (int32_t e = n - 1; e >= 0; --e) ids.push_back(e);
                               return ids;
                             }));
  EXPECT_TRUE(bitwise_equal(reference, prefill_logits(*reversed, tokens)));

  auto doubled = load_model(tiny_checkpoint_dir(), options_with([n](int64_t) {
                              std::vector<int32_t> ids;
                              for (int32_t e = 0; e < 2 * n; ++e) ids.push_back(e % n);
                              return ids;
                            }));
  EXPECT_TRUE(bitwise_equal(reference, prefill_logits(*doubled, tokens)));
}

TEST(ExpertSelectionTest, ATokenRoutedToAnExpertNotHeldIsAClearError) {
  auto half = load_model(tiny_checkpoint_dir(),
                         options_with([](int64_t) { return std::vector<int32_t>{0}; }));
  Status status;
  prefill_logits(*half, test_tokens(12, half->config().vocab_size, 4), &status);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.to_string().find("is not held by this process"), std::string::npos)
      << status.to_string();
}

TEST(ExpertSelectionTest, SelectingAnExpertOutsideTheModelFailsTheLoad) {
  auto model = DeepseekModel::load(tiny_checkpoint_dir(), options_with([](int64_t) {
                                     return std::vector<int32_t>{0, 1000};
                                   }));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().to_string().find("routed expert 1000"), std::string::npos)
      << model.status().to_string();
}

// Tensors of experts another rank may hold are not loaded here; anything else that only
// looks like one (an expert id past the model's experts) is still a stray tensor. Under a
// selection every ".mlp.experts." name passed.
TEST(ExpertSelectionTest, AStrayExpertTensorIsReportedUnderASelectionToo) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("peerserve_stray_expert_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(tiny_checkpoint_dir(), dir, fs::copy_options::recursive);
  // One more shard with one BF16 scalar, listed in the index.
  const std::string stray = "model.layers.1.mlp.experts.9999.gate_proj.weight";
  std::string header =
      R"({")" + stray + R"(":{"dtype":"BF16","shape":[1,1],"data_offsets":[0,2]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  {
    std::ofstream out(dir / "stray.safetensors", std::ios::binary);
    const uint64_t length = header.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
    out.write("\0\0", 2);
  }
  nlohmann::json index;
  {
    std::ifstream in(dir / "model.safetensors.index.json");
    in >> index;
  }
  index["weight_map"][stray] = "stray.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();

  auto model = DeepseekModel::load(dir.string(), options_with([](int64_t) {
                                     return std::vector<int32_t>{0, 1};
                                   }));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().to_string().find("experts.9999"), std::string::npos)
      << model.status().to_string();
  fs::remove_all(dir);
}

// Two owners, each holding half of the experts (as two EP ranks would). Every (token,
// expert) pair goes to its owner as a token of its own with weight 1, so the owner returns
// the expert's output unweighted; the source then sums w * output in top-k order, exactly
// as the local backend does.
class TwoOwnerBackend final : public ExpertBackend {
 public:
  TwoOwnerBackend(std::shared_ptr<ExpertBackend> even, std::shared_ptr<ExpertBackend> odd)
      : owners_{std::move(even), std::move(odd)} {}

  std::unique_ptr<Call> new_call(int slot) override {
    auto call = std::make_unique<SplitCall>();
    for (int o = 0; o < 2; ++o) call->owner_calls[o] = owners_[o]->new_call(slot);
    return call;
  }
  Status dispatch(const RoutedTokens& tokens, Call& base) override {
    auto& call = dynamic_cast<SplitCall&>(base);
    call.tokens = tokens;
    for (int o = 0; o < 2; ++o) {
      call.x[o].clear();
      call.ids[o].clear();
      call.pair_of[o].clear();
    }
    const int64_t hidden = tokens.hidden_size;
    for (int64_t i = 0; i < tokens.num_tokens * tokens.top_k; ++i) {
      const int o = tokens.expert_ids[i] % 2;
      const float* row = tokens.activations.data() + (i / tokens.top_k) * hidden;
      call.x[o].insert(call.x[o].end(), row, row + hidden);
      call.ids[o].push_back(tokens.expert_ids[i]);
      call.pair_of[o].push_back(i);
    }
    for (int o = 0; o < 2; ++o) {
      call.ones[o].assign(call.ids[o].size(), 1.0f);
      RoutedTokens sent;
      sent.layer = tokens.layer;
      sent.num_tokens = static_cast<int64_t>(call.ids[o].size());
      sent.hidden_size = hidden;
      sent.top_k = 1;
      sent.activations = call.x[o];
      sent.expert_ids = call.ids[o];
      sent.weights = call.ones[o];
      if (sent.num_tokens > 0) {
        PS_RETURN_IF_ERROR(owners_[o]->dispatch(sent, *call.owner_calls[o]));
      }
    }
    return ok_status();
  }
  Status compute(Call& base) override {
    auto& call = dynamic_cast<SplitCall&>(base);
    for (int o = 0; o < 2; ++o) {
      if (call.ids[o].empty()) continue;
      PS_RETURN_IF_ERROR(owners_[o]->compute(*call.owner_calls[o]));
      call.y[o].resize(call.x[o].size());
      PS_RETURN_IF_ERROR(owners_[o]->combine(*call.owner_calls[o], call.y[o]));
    }
    return ok_status();
  }
  Status combine(Call& base, std::span<float> out) override {
    auto& call = dynamic_cast<SplitCall&>(base);
    const int64_t hidden = call.tokens.hidden_size, top_k = call.tokens.top_k;
    std::vector<const float*> result(call.tokens.num_tokens * top_k);
    for (int o = 0; o < 2; ++o) {
      for (size_t r = 0; r < call.pair_of[o].size(); ++r) {
        result[call.pair_of[o][r]] = call.y[o].data() + r * hidden;
      }
    }
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t i = 0; i < call.tokens.num_tokens * top_k; ++i) {
      kernels::axpy(call.tokens.weights[i], result[i], out.data() + (i / top_k) * hidden, hidden);
    }
    return ok_status();
  }

 private:
  struct SplitCall final : Call {
    RoutedTokens tokens;
    std::unique_ptr<Call> owner_calls[2];
    std::vector<float> x[2], y[2], ones[2];
    std::vector<int32_t> ids[2];
    std::vector<int64_t> pair_of[2];
  };
  std::shared_ptr<ExpertBackend> owners_[2];
};

TEST(ExpertSelectionTest, ExpertsSplitOverTwoOwnersGiveTheWholeModelsLogitsBitwise) {
  auto whole = load_model(tiny_checkpoint_dir(), options_with({}));
  const int32_t n = static_cast<int32_t>(whole->config().n_routed_experts);
  auto share = [n](int parity) {
    return [n, parity](int64_t) {
      std::vector<int32_t> ids;
      for (int32_t e = parity; e < n; e += 2) ids.push_back(e);
      return ids;
    };
  };
  auto even = load_model(tiny_checkpoint_dir(), options_with(share(0)));
  auto odd = load_model(tiny_checkpoint_dir(), options_with(share(1)));
  const std::vector<int32_t> tokens = test_tokens(14, whole->config().vocab_size, 8);
  const std::vector<float> reference = prefill_logits(*whole, tokens);

  even->set_expert_backend(
      std::make_shared<TwoOwnerBackend>(even->expert_backend(), odd->expert_backend()));
  EXPECT_TRUE(bitwise_equal(reference, prefill_logits(*even, tokens)));
}

}  // namespace
}  // namespace peerserve
