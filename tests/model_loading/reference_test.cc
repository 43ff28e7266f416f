// The generated checkpoint and tokenizer, checked by independent implementations: numpy reads
// the shards and dequantizes FP8 itself (reference_checkpoint_reader.py); the npm tokenizer
// library loads tokenizer.json and applies the chat template (reference_tokenizer.js).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/test_model.h"
#include "model/checkpoint/test_tokenizer.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve {
namespace {

std::string source_dir() {
  const char* dir = std::getenv("PEERSERVE_SOURCE_DIR");
  return std::filesystem::absolute(dir ? dir : ".").string();
}

// Runs a command, returns its stdout; exit status in `status`.
std::string run(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    status = -1;
    return out;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  status = pclose(pipe);
  return out;
}

class ReferenceTest : public ::testing::TestWithParam<bool> {};

TEST_P(ReferenceTest, NumpyReadsTheSameBf16Values) {
  const bool fp8 = GetParam();
  testing::ScratchDir dir;
  TestModelOptions options;
  options.seed = 11;
  options.fp8 = fp8;
  ASSERT_TRUE(write_test_model(dir.path(), options).ok());
  int status = 0;
  const std::string out = dir.file("reference");
  run("/usr/bin/python3 " + source_dir() + "/tests/model_loading/reference_checkpoint_reader.py " +
          dir.path() + " " + out + " 2>&1",
      status);
  ASSERT_EQ(status, 0);
  const auto listing = nlohmann::json::parse(testing::read_file_bytes(out + ".json"));
  const std::string bits = testing::read_file_bytes(out + ".bin");

  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  size_t checked = 0;
  for (const auto& entry : listing) {
    const std::string name = entry["name"];
    const std::vector<int64_t> shape = entry["shape"];
    Result<WeightTensor> w = ckpt->get_bf16(name, shape);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const size_t offset = entry["offset"];
    for (int64_t i = 0; i < w->numel(); ++i) {
      uint16_t expected = 0;
      std::memcpy(&expected, bits.data() + 2 * (offset + static_cast<size_t>(i)), 2);
      ASSERT_EQ(w->bf16_data()[i].bits, expected) << name << " [" << i << "]";
    }
    ++checked;
  }
  EXPECT_GT(checked, 100u);
  EXPECT_TRUE(ckpt->check_all_used().ok()) << ckpt->check_all_used().to_string();
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp8, ReferenceTest, ::testing::Values(false, true));

TEST(TokenizerReferenceTest, NpmTokenizerLoadsAndRoundTrips) {
  const std::string modules = source_dir() + "/tests/js/node_modules";
  if (!std::filesystem::exists(modules + "/@lenml/tokenizers")) {
    GTEST_SKIP() << "run scripts/install-test-js.sh first";
  }
  testing::ScratchDir dir;
  ASSERT_TRUE(write_test_model(dir.path(), TestModelOptions{}).ok());
  int status = 0;
  const std::string output =
      run("node " + source_dir() + "/tests/model_loading/reference_tokenizer.js " + modules + " " +
              dir.path() + " 2>&1",
          status);
  ASSERT_EQ(status, 0) << output;
  const auto r = nlohmann::json::parse(output);
  EXPECT_EQ(r["decoded"], "Hello world, the cat is in the house! 123 données ünïcode 你好");
  // (This library applies the ByteLevel post-processor as written and adds no BOS, exactly
  // as it does for DeepSeek-V3's own tokenizer.json; the chat template adds it instead.)
  ASSERT_FALSE(r["ids"].empty());
  for (const auto& id : r["ids"]) EXPECT_LT(id.get<int64_t>(), test_tokenizer_vocab_size());
  // Merges apply: fewer tokens than bytes.
  EXPECT_LT(r["ids"].size(), 60u);
  EXPECT_EQ(r["chat"], "<｜begin▁of▁sentence｜><｜User｜>Hi there<｜Assistant｜>");
  const auto& chat_ids = r["chat_ids"];
  ASSERT_GE(chat_ids.size(), 4u);
  EXPECT_EQ(chat_ids[0], 0);
  EXPECT_EQ(chat_ids[1], r["user_id"]);
  EXPECT_EQ(chat_ids.back(), r["assistant_id"]);
}

}  // namespace
}  // namespace peerserve
