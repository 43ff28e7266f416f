// ExpertWeightsStore: an expert prepared to INT8 keeps no BF16 form (as the model's own weights
// after quantize_weights_int8): from an FP8 checkpoint that form is a converted copy, which
// each rank under --ep --quantize int8 kept beside the INT8 one.
#include "dist/expert_weights_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/checkpoint/test_model.h"
#include "model/weight_quantization.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve::dist {
namespace {

TEST(ExpertWeightsStoreTest, Int8ExpertsKeepNoBf16Form) {
  testing::ScratchDir dir;
  TestModelOptions model;
  model.preset = TestModelPreset::kTiny;
  model.fp8 = true;
  ASSERT_TRUE(write_test_model(dir.path(), model).ok());
  Result<ModelConfig> config = test_model_config(model);
  ASSERT_TRUE(config.ok());
  std::vector<int> moe_layers;
  for (int64_t l = 0; l < config->num_hidden_layers; ++l) {
    if (config->is_moe_layer(l)) moe_layers.push_back(static_cast<int>(l));
  }
  auto placement =
      ExpertPlacement::contiguous(moe_layers, static_cast<int>(config->n_routed_experts), 1);
  ASSERT_TRUE(placement.ok());
  auto store = ExpertWeightsStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  std::vector<std::weak_ptr<const void>> bf16_forms;
  auto set =
      (*store)->load(*placement, 0, config->num_hidden_layers, [&](int64_t, MlpWeights& expert) {
        for (const LinearWeight* w : {&expert.gate, &expert.up, &expert.down}) {
          bf16_forms.push_back(w->storage);
        }
        return quantize_mlp_int8(expert);
      });
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  int64_t experts = 0;
  for (const auto& layer : (*set)->by_layer) {
    for (const MlpWeights& expert : layer) {
      ++experts;
      EXPECT_NE(expert.gate_up_int8, nullptr);
      EXPECT_NE(expert.down.int8, nullptr);
      for (const LinearWeight* w : {&expert.gate, &expert.up, &expert.down}) {
        EXPECT_EQ(w->data, nullptr);
      }
    }
  }
  EXPECT_EQ(experts, static_cast<int64_t>(moe_layers.size()) * config->n_routed_experts);
  ASSERT_FALSE(bf16_forms.empty());
  for (const std::weak_ptr<const void>& form : bf16_forms) {
    EXPECT_TRUE(form.expired()) << "a converted BF16 copy of an INT8 expert stayed";
  }
}

}  // namespace
}  // namespace peerserve::dist
