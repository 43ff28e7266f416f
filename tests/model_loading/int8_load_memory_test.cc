// Quantizing at load (--quantize int8) must not keep the checkpoint's BF16 pages of the
// quantized weights resident beside their INT8 copies: a 16 B model then needed its BF16
// size (~32 GB) in resident memory instead of about half. A checkpoint whose bytes are
// nearly all expert weights (as a real MoE's are): without the release the resident set grows
// by the INT8 copies (~0.5x the file) plus the file's pages (~1.0x); with it, by the INT8
// copies and the few BF16 weights that stay (embeddings, kv_b, norms, router).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/deepseek_model.h"
#include "tests/base/resident_memory.h"
#include "tests/model_loading/constant_checkpoint.h"

namespace peerserve {
namespace {

TEST(Int8LoadMemoryTest, QuantizedWeightsLeaveNoResidentBf16Copy) {
  testing::ScratchDir dir;
  ModelConfig config = test_model_config(TestModelPreset::kTiny, false);
  config.hidden_size = 256;
  config.n_routed_experts = 64;
  config.num_experts_per_tok = 4;
  config.moe_intermediate_size = 256;
  const uint64_t file_bytes = testing::write_constant_checkpoint(dir, config, std::byte{0x3c});
  ASSERT_GT(file_bytes, 40ull << 20);

  ModelOptions options;
  options.num_threads = 2;
  options.quantize = WeightQuantization::kInt8;
  options.quantize_lm_head = true;
  const int64_t before = testing::resident_bytes();
  Result<std::unique_ptr<DeepseekModel>> model = DeepseekModel::load(dir.path(), options);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const int64_t after = testing::resident_bytes();
  const double growth = static_cast<double>(after - before);
  RecordProperty("resident_growth_bytes", std::to_string(growth));
  RecordProperty("checkpoint_bytes", std::to_string(file_bytes));
  EXPECT_LT(growth, 0.8 * static_cast<double>(file_bytes))
      << "resident set grew by " << growth / (1 << 20) << " MiB for a "
      << static_cast<double>(file_bytes) / (1 << 20) << " MiB checkpoint";
}

}  // namespace
}  // namespace peerserve
