// Loading a BF16 checkpoint must not need more resident memory than ~1.2x its size: BF16
// tensors are used zero-copy from the file mapping, so reading every tensor adds the file's
// pages (1.0x) and nothing else. A loader that copied the weights would add 2.0x.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/tensor_layout.h"
#include "tests/base/resident_memory.h"
#include "tests/model_loading/constant_checkpoint.h"

namespace peerserve {
namespace {

TEST(MemoryTest, Bf16CheckpointResidentGrowthBelow1Point2xItsSize) {
  testing::ScratchDir dir;
  // A tiny-architecture config with a large vocabulary so that the checkpoint is ~64 MiB.
  ModelConfig config = test_model_config(TestModelPreset::kTiny, false);
  config.vocab_size = 131072;
  // The writer's buffers are freed when it returns.
  const uint64_t file_bytes = testing::write_constant_checkpoint(dir, config, std::byte{0x3f});
  ASSERT_GT(file_bytes, 60ull << 20);

  const int64_t before = testing::resident_bytes();
  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<WeightTensor> weights;
  uint64_t checksum = 0;
  for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
    Result<WeightTensor> w = ckpt->get_bf16(spec.name, spec.shape);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE(w->zero_copy);
    // Touch every element, as a forward pass would.
    for (int64_t i = 0; i < w->numel(); ++i) checksum += w->bf16_data()[i].bits;
    weights.push_back(*std::move(w));
  }
  const int64_t after = testing::resident_bytes();
  EXPECT_EQ(checksum, static_cast<uint64_t>(file_bytes / 2) * 0x3f3f);
  const double growth = static_cast<double>(after - before);
  RecordProperty("resident_growth_bytes", std::to_string(growth));
  RecordProperty("checkpoint_bytes", std::to_string(file_bytes));
  EXPECT_LT(growth, 1.2 * static_cast<double>(file_bytes))
      << "resident set grew by " << growth / (1 << 20) << " MiB for a "
      << static_cast<double>(file_bytes) / (1 << 20) << " MiB checkpoint";
}

}  // namespace
}  // namespace peerserve
