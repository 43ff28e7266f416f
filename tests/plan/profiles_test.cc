// Hardware and model profiles: every shipped profile loads, bad files are rejected with a
// message naming the field, and derived model quantities match published numbers.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "plan/profiles/hardware_profile.h"
#include "plan/profiles/model_profile.h"
#include "plan/profiles/precision.h"
#include "tests/plan/test_data.h"

namespace peerserve::plan {
namespace {

using testing::read_json;
using testing::source_dir;

nlohmann::json ascend_json() {
  return read_json(source_dir() / "data/hardware/ascend-910c.json");
}

std::string error_of(const nlohmann::json& json) {
  auto hw = hardware_profile_from_json(json, "test.json");
  EXPECT_FALSE(hw.ok());
  return hw.ok() ? std::string() : hw.status().message();
}

TEST(HardwareProfile, EveryShippedProfileLoadsAndIsNamedAfterItsFile) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "data/hardware")) {
    auto hw = hardware_profile_from_json(read_json(entry.path()), entry.path().string());
    ASSERT_TRUE(hw.ok()) << hw.status().to_string();
    EXPECT_EQ(hw->name, entry.path().stem().string());
    ++count;
  }
  EXPECT_GE(count, 6);  // ascend-910c, h800, h100, h200, b200, gb200
}

TEST(HardwareProfile, AscendPeaksAndUnits) {
  auto hw = hardware_profile_from_json(ascend_json(), "ascend");
  ASSERT_TRUE(hw.ok());
  // Paper 000 §3.3.1: 376 TFLOPS BF16 per die, 1.6 TB/s, 64 GB; INT8 at twice BF16.
  EXPECT_DOUBLE_EQ(*hw->peak_flops(Precision::kBf16), 376e12);
  EXPECT_DOUBLE_EQ(*hw->peak_flops(Precision::kInt8), 752e12);
  EXPECT_EQ(hw->devices_per_package, 2);
  EXPECT_EQ(hw->link_for_group(320).name, "UB");
  auto fp8 = hw->peak_flops(Precision::kFp8);
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("int8"), std::string::npos);  // names what it has
}

TEST(HardwareProfile, MissingFieldIsNamed) {
  auto json = ascend_json();
  json.erase("hbm_bandwidth_gb_s");
  const std::string message = error_of(json);
  EXPECT_NE(message.find("hbm_bandwidth_gb_s: missing"), std::string::npos) << message;
}

TEST(HardwareProfile, NonsensicalValuesAreNamedWithTheExpectedRange) {
  auto json = ascend_json();
  json["efficiency"]["gemm"] = 1.7;
  json["scale_up"]["bandwidth_gb_s"] = -5;
  json["peak_tflops"]["fp7"] = 100;
  json["hbm_capacity_gb"] = "lots";
  const std::string message = error_of(json);
  EXPECT_NE(message.find("efficiency.gemm = 1.7"), std::string::npos) << message;
  EXPECT_NE(message.find("(0, 1]"), std::string::npos) << message;
  EXPECT_NE(message.find("scale_up.bandwidth_gb_s = -5"), std::string::npos) << message;
  EXPECT_NE(message.find("unknown precision 'fp7'"), std::string::npos) << message;
  EXPECT_NE(message.find("hbm_capacity_gb = \"lots\", expected a number"), std::string::npos)
      << message;
}

TEST(HardwareProfile, MisspeltAndStructuralErrors) {
  auto json = ascend_json();
  json["efficency"] = json["efficiency"];
  EXPECT_NE(error_of(json).find("efficency: unknown field"), std::string::npos);

  json = ascend_json();
  json["reserved_memory_gb"] = 80;
  EXPECT_NE(error_of(json).find("reserved_memory_gb"), std::string::npos);

  json = ascend_json();
  json["devices_per_package"] = 1.5;
  EXPECT_NE(error_of(json).find("whole number"), std::string::npos);

  EXPECT_NE(error_of(nlohmann::json::array()).find("expected a JSON object"), std::string::npos);
}

TEST(HardwareProfile, RoundTripsThroughJson) {
  auto hw = hardware_profile_from_json(ascend_json(), "ascend");
  ASSERT_TRUE(hw.ok());
  auto again = hardware_profile_from_json(hardware_profile_to_json(*hw), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->efficiency.gemm, hw->efficiency.gemm);
  EXPECT_EQ(again->fixed.all_to_all_per_token_copy_ns, hw->fixed.all_to_all_per_token_copy_ns);
  EXPECT_EQ(again->memory_pool_paths.at("vpc").bandwidth_gb_s,
            hw->memory_pool_paths.at("vpc").bandwidth_gb_s);
}

TEST(Precision, ParsesKnownNamesOnly) {
  EXPECT_EQ(*parse_precision("INT8"), Precision::kInt8);
  EXPECT_EQ(bytes_per_element(Precision::kFp4), 0.5);
  auto bad = parse_precision("fp12");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp4, fp8, int8, bf16"), std::string::npos);
}

// Published sizes: DeepSeek-V3 671B total / 37B activated (paper 002 §2.2.1), Qwen3-235B-A22B
// by its name, Kimi-K2 "1T total, 32B activated" by its model card. Activated counts include
// the embedding and LM head. Tolerances cover the rounding of the published figures (1.5%
// for three significant digits, 4% for "1T" and "32B").
TEST(ModelProfile, ParameterCountsMatchPublishedSizes) {
  struct Case {
    const char* preset;
    double total_b, activated_b, tolerance;
  };
  const Case cases[] = {{"deepseek-v3", 671, 37, 0.015},
                        {"qwen3-235b-a22b", 235, 22, 0.015},
                        {"kimi-k2", 1000, 32, 0.04}};
  for (const Case& c : cases) {
    auto m = model_preset(c.preset);
    ASSERT_TRUE(m.ok());
    EXPECT_NEAR(total_weights(*m) / 1e9, c.total_b, c.total_b * c.tolerance) << c.preset;
    const double activated = activated_weights_per_token(*m) + 2.0 * embedding_weights(*m);
    EXPECT_NEAR(activated / 1e9, c.activated_b, c.activated_b * c.tolerance) << c.preset;
  }
}

TEST(ModelProfile, KvCachePerTokenMatchesPaper002Table1) {
  auto v3 = model_preset("deepseek-v3");
  ASSERT_TRUE(v3.ok());
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(*v3, 2.0), 70272.0);  // "70.272 KB" (KB = 1000 B)
  auto qwen = model_preset("qwen3-235b-a22b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(*qwen, 2.0), 2.0 * 4 * 128 * 2 * 94);
}

TEST(ModelProfile, HuggingFaceConfigsEqualThePresets) {
  for (const char* name : {"deepseek-v3", "qwen3-235b-a22b", "kimi-k2"}) {
    const auto path = source_dir() / "data/models" / (std::string(name) + ".json");
    auto parsed = model_profile_from_hf_config(read_json(path), path.string(), name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    auto preset = model_preset(name);
    ASSERT_TRUE(preset.ok());
    EXPECT_EQ(model_profile_to_json(*parsed), model_profile_to_json(*preset)) << name;
  }
}

TEST(ModelProfile, BadConfigsNameTheField) {
  auto config = read_json(source_dir() / "data/models/deepseek-v3.json");
  config.erase("num_hidden_layers");
  auto missing = model_profile_from_hf_config(config, "config.json", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("config.json: num_hidden_layers: missing"),
            std::string::npos)
      << missing.status().message();

  config = read_json(source_dir() / "data/models/deepseek-v3.json");
  config["num_experts_per_tok"] = 300;
  auto too_many = model_profile_from_hf_config(config, "config.json", "x");
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("experts_per_token"), std::string::npos);

  config["num_experts_per_tok"] = -1;
  EXPECT_FALSE(model_profile_from_hf_config(config, "config.json", "x").ok());
  EXPECT_FALSE(model_preset("gpt-5").ok());
}

}  // namespace
}  // namespace peerserve::plan
