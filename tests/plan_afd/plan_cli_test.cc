// `peerserve plan afd` and `peerserve plan placement` driven through CLI11.
#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/command_registry.h"
#include "apps/plan_command_inputs.h"
#include "plan/afd/afd_cli.h"
#include "plan/placement/placement_cli.h"

namespace peerserve::plan {
namespace {

struct CommandRun {
  int exit_code = 0;
  std::string out;
  std::string err;
};

CommandRun run(std::vector<std::string> args) {
  CLI::App root{"peerserve"};
  auto* plan = root.add_subcommand("plan", "planner");
  add_plan_afd_command(*plan);
  add_plan_placement_command(*plan);
  args.insert(args.begin(), "peerserve");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  set_command_exit_code(0);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  CommandRun result;
  try {
    root.parse(static_cast<int>(argv.size()), argv.data());
    result.exit_code = command_exit_code();
  } catch (const CLI::ParseError& error) {
    result.exit_code = 100 + error.get_exit_code();
  }
  result.out = testing::internal::GetCapturedStdout();
  result.err = testing::internal::GetCapturedStderr();
  return result;
}

std::string source_path(const std::string& relative) {
  const char* root = std::getenv("PEERSERVE_SOURCE_DIR");
  return std::string(root ? root : ".") + "/" + relative;
}

TEST(PlanAfdCommand, PrintsTheOptimumAsJson) {
  const CommandRun r = run({"plan", "afd", "--json", "--ratios", "1,9.3,32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_NEAR(out["optimum"]["ratio"].get<double>(), 9.30, 0.005);
  EXPECT_EQ(out["optimum"]["binding"], "attention-bound");
  ASSERT_EQ(out["ratio_sweep"].size(), 3u);
  EXPECT_NEAR(out["ratio_sweep"][2]["throughput_per_instance"].get<double>(), 0.3183, 5e-5);
}

TEST(PlanAfdCommand, SweepsAndSimulates) {
  const CommandRun r =
      run({"plan", "afd", "--json", "--ratios", "1,2", "--simulate", "--requests-per-instance",
           "200", "--sweep", "mu_D", "--values", "100,500"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_TRUE(out["ratio_sweep"][0].contains("simulated"));
  ASSERT_EQ(out["parameter_sweep"].size(), 2u);
  EXPECT_NEAR(out["parameter_sweep"][0]["optimum"]["ratio"].get<double>(), 2.1694, 1e-4);
}

TEST(PlanAfdCommand, ExplainsBadInput) {
  CommandRun r = run({"plan", "afd", "--batch", "0"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("microbatch B"), std::string::npos) << r.err;
  r = run({"plan", "afd", "--simulate", "--ratios", "2.5"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("whole number"), std::string::npos) << r.err;
  r = run({"plan", "afd", "--sweep", "B"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("needs --values"), std::string::npos) << r.err;
  r = run({"plan", "afd", "--convention", "other"});
  EXPECT_GE(r.exit_code, 100);  // rejected by the flag parser (100 + its code here)
}

TEST(PlanAfdCommand, ReproducesThePaper) {
  const CommandRun r = run({"plan", "afd", "--reproduce", "--requests-per-instance", "300"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("17.25"), std::string::npos);
  EXPECT_NE(r.out.find("[INCONSISTENT]"), std::string::npos);
  // N -> infinity cannot be simulated: refused (it aborted the process).
  const CommandRun infinite = run({"plan", "afd", "--reproduce", "--requests-per-instance", "0"});
  EXPECT_EQ(infinite.exit_code, kExitFailure);
  EXPECT_NE(infinite.err.find("finite N >= 1"), std::string::npos) << infinite.err;
}

// --routing skewed:H takes only a whole finite number H >= 1 ("4garbage" was read as 4, and
// NaN as uniform routing).
TEST(PlanRoutingFlag, SkewedNeedsAWholeFiniteNumber) {
  const Result<ModelProfile> model = model_preset("deepseek-v3");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const char* bad : {"skewed:4garbage", "skewed:nan", "skewed:inf", "skewed:", "skewed:0.5"}) {
    plan_inputs::DeploymentFlags flags;
    flags.routing = bad;
    PrefillDeployment prefill;
    DecodeDeployment decode;
    const Status s = plan_inputs::apply_routing(flags, *model, prefill, decode);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("finite number H >= 1"), std::string::npos) << s.message();
  }
  plan_inputs::DeploymentFlags flags;
  flags.routing = "skewed:4";
  PrefillDeployment prefill;
  DecodeDeployment decode;
  EXPECT_TRUE(plan_inputs::apply_routing(flags, *model, prefill, decode).ok());
}

TEST(PlanPlacementCommand, ComparesAlgorithmsOnSyntheticRouting) {
  const auto dir = std::filesystem::temp_directory_path() / "peerserve_plan_cli_test_traces";
  std::filesystem::remove_all(dir);
  const CommandRun r = run({"plan",
                            "placement",
                            "--json",
                            "--compare",
                            "--experts",
                            "32",
                            "--top-k",
                            "4",
                            "--moe-layers",
                            "2",
                            "--requests",
                            "4",
                            "--prefill-min",
                            "32",
                            "--prefill-max",
                            "32",
                            "--decode-steps",
                            "16",
                            "--max-over-mean",
                            "5",
                            "--ranks",
                            "4",
                            "--redundant-per-rank",
                            "1",
                            "--stats",
                            "--write-trace",
                            dir.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  ASSERT_EQ(out["studies"].size(), 3u);
  EXPECT_EQ(out["studies"][0]["algorithm"], "eplb");
  EXPECT_EQ(out["studies"][1]["slots_per_rank"], 8);  // Remap keeps E/G
  EXPECT_EQ(out["studies"][2]["slots_per_rank"], 9);  // Dup adds one per rank
  EXPECT_EQ(out["statistics"]["max_over_mean_per_layer"].size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir / "3.json"));

  // The written traces read back through --trace.
  const CommandRun again = run({"plan", "placement", "--trace", dir.string(), "--experts", "32",
                                "--ranks", "4", "--algorithm", "remap"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("remap"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// The roofline cost is evaluated at one step's tokens (--batch-tokens): its time does not
// grow with the trace's length (it took the whole trace for one batch).
TEST(PlanPlacementCommand, RooflineCostIsPerStep) {
  auto moe_time = [](const std::string& steps, bool with_batch) {
    std::vector<std::string> args = {"plan", "placement",       "--json",  "--experts",
                                     "32",   "--top-k",         "4",       "--moe-layers",
                                     "2",    "--requests",      "8",       "--decode-steps",
                                     steps,  "--max-over-mean", "4",       "--ranks",
                                     "4",    "--cost",          "roofline"};
    if (with_batch) {
      args.push_back("--batch-tokens");
      args.push_back("64");
    }
    const CommandRun r = run(args);
    if (!with_batch) {
      EXPECT_EQ(r.exit_code, kExitFailure);
      EXPECT_NE(r.err.find("--batch-tokens"), std::string::npos) << r.err;
      return 0.0;
    }
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["studies"][0]["before"]["moe_time"].get<double>();
  };
  moe_time("8", false);
  const double short_trace = moe_time("8", true);
  const double long_trace = moe_time("128", true);
  ASSERT_GT(short_trace, 0.0);
  EXPECT_GT(long_trace / short_trace, 0.5);
  EXPECT_LT(long_trace / short_trace, 2.0);
}

TEST(PlanPlacementCommand, ReadsTheCommittedSampleAndReportsFileErrors) {
  CommandRun r =
      run({"plan", "placement", "--trace", source_path("data/traces/tiny_request.json"),
           "--experts", "8", "--ranks", "2", "--algorithm", "dup", "--redundant-per-rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run({"plan", "placement", "--trace", "/nonexistent/trace.json", "--experts", "8"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("no such trace file or directory"), std::string::npos) << r.err;
  r = run({"plan", "placement", "--trace", source_path("data/traces/tiny_request.json"),
           "--experts", "4"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("tiny_request.json: routing trace: step 0 (prefill)"), std::string::npos)
      << r.err;
  r = run({"plan", "placement", "--trace", source_path("data/traces/tiny_request.json")});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("--experts is required"), std::string::npos) << r.err;
  r = run({"plan", "placement", "--algorithm", "remap", "--redundant-per-rank", "1", "--moe-layers",
           "1", "--requests", "1", "--decode-steps", "1"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_NE(r.err.find("Remap keeps E/G"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace peerserve::plan
