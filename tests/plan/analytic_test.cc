// The analytical model: closed forms against the papers' printed values, hand-computed
// examples and brute-force enumerations, and internal consistency of the estimates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "plan/analytic/all_to_all.h"
#include "plan/analytic/connection_mapping.h"
#include "plan/analytic/decode_bound.h"
#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment_presets.h"
#include "plan/analytic/layer_estimate.h"
#include "plan/analytic/model_loading.h"
#include "plan/analytic/pd_ratio.h"
#include "plan/analytic/prefill_model.h"
#include "plan/analytic/routing_imbalance.h"
#include "plan/sim/workload.h"
#include "tests/plan/test_data.h"

namespace peerserve::plan {
namespace {

// Paper 002 §2.3.2 with the paper's own inputs ("7K" = 7000): every printed digit.
TEST(DecodeBound, ReproducesPaper002Exactly) {
  DecodeBoundInputs in;
  in.hidden_size = 7000;
  in.layers = 61;
  in.tokens_per_device = 32;
  in.fan_out = 9;
  in.bandwidth_gb_s = 50;
  const DecodeBound ib = decode_communication_bound(in);
  EXPECT_NEAR(ib.comm_s * 1e6, 120.96, 1e-9);
  EXPECT_NEAR(ib.layer_s * 1e6, 241.92, 1e-9);
  EXPECT_NEAR(ib.tpot_s * 1e3, 14.76, 0.005);  // 14.757 printed as 14.76
  EXPECT_EQ(static_cast<int>(ib.tokens_per_s), 67);
  in.bandwidth_gb_s = 900;
  const DecodeBound nvl = decode_communication_bound(in);
  EXPECT_NEAR(nvl.comm_s * 1e6, 6.72, 1e-9);
  EXPECT_NEAR(nvl.tpot_s * 1e3, 0.82, 0.005);
  EXPECT_NEAR(nvl.tokens_per_s, 1200, 25);  // "approximately 1200"
}

// Paper 000 eq. 1-2 and its example: 320 ranks, 96 tokens, min(8, 1), 7.5 KB and 14 KB
// messages: "225 MB", "420 MB", "645 MB" (MiB).
TEST(ExpertBuffers, ReproducePaper000Example) {
  const ExpertBuffers b = expert_buffers(320, 96, 8, 1, 7.5 * 1024, 14 * 1024);
  EXPECT_DOUBLE_EQ(b.max_tokens, 96);
  EXPECT_DOUBLE_EQ(b.dispatch_bytes, 320.0 * 96 * 7680);
  EXPECT_DOUBLE_EQ(b.dispatch_bytes / (1 << 20), 225.0);
  EXPECT_DOUBLE_EQ(b.combine_bytes / (1 << 20), 420.0);
  EXPECT_DOUBLE_EQ(b.total_bytes() / (1 << 20), 645.0);
  // Two experts per die: max_tokens = 96 x min(8, 2).
  EXPECT_DOUBLE_EQ(expert_buffers(320, 96, 8, 2, 7680, 14336).max_tokens, 192);
  // The message sizes come from the model: 7168 INT8 + 512 B of scales; 7168 BF16.
  auto model = model_preset("deepseek-v3");
  auto decode = decode_preset("cloudmatrix-decode");
  ASSERT_TRUE(model.ok() && decode.ok());
  EXPECT_DOUBLE_EQ(dispatch_bytes_per_copy(*model, decode->precision), 7680);
  EXPECT_DOUBLE_EQ(combine_bytes_per_copy(*model, decode->precision), 14336);
  // The decode estimate sizes them by the die's whole batch (48 requests x 2 tokens with MTP =
  // the paper's 96), microbatched or not: they were half of it with two microbatches.
  const HardwareSet hardware = testing::load_hardware_set();
  auto e = estimate_decode(*model, hardware.at("ascend-910c"), *decode, 48, 4096, 4096);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(e->moe_layer.microbatched);
  EXPECT_DOUBLE_EQ(e->memory.buffers.max_tokens, 96);
  EXPECT_DOUBLE_EQ(e->memory.buffers.dispatch_bytes / (1 << 20), 225.0);
  EXPECT_DOUBLE_EQ(e->memory.buffers.combine_bytes / (1 << 20), 420.0);
}

// §4.3.3 worked by hand: prefill TP 4, decode TP 2, DP 4 -> ratio 2, group size 2.
TEST(ConnectionMapping, HandExampleAndBalance) {
  ConnectionMappingOptions o{4, 2, 4};
  const int expected[4][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  auto mapping = prefill_decode_connection_mapping(o);
  ASSERT_TRUE(mapping.ok());
  for (int dp = 0; dp < 4; ++dp) {
    for (int tp = 0; tp < 2; ++tp) {
      EXPECT_EQ(mapping->source[dp][tp], expected[dp][tp]) << dp << "," << tp;
      EXPECT_EQ(*prefill_source_rank(o, tp, dp), expected[dp][tp]);
    }
  }
  EXPECT_EQ(mapping->load_per_prefill_rank, (std::vector<int>{2, 2, 2, 2}));
  // CloudMatrix-like: prefill TP 32, decode DP 320 -> every prefill rank serves 10.
  auto big = prefill_decode_connection_mapping({32, 1, 320});
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(std::set<int>(big->load_per_prefill_rank.begin(), big->load_per_prefill_rank.end()),
            std::set<int>{10});
}

TEST(ConnectionMapping, RejectsShapesTheSchemeCannotBalance) {
  auto ratio = prefill_source_rank({3, 2, 4}, 0, 0);
  ASSERT_FALSE(ratio.ok());
  EXPECT_NE(ratio.status().message().find("not a multiple of decode_tp"), std::string::npos);
  EXPECT_FALSE(prefill_source_rank({4, 1, 6}, 0, 0).ok());  // 6 dp ranks, ratio 4
  EXPECT_FALSE(prefill_source_rank({4, 2, 4}, 2, 0).ok());  // tp rank out of range
  EXPECT_FALSE(prefill_source_rank({0, 1, 1}, 0, 0).ok());
}

// Expected remote nodes per token against brute-force enumeration of every routing choice.
TEST(AllToAll, RemoteNodesMatchEnumeration) {
  // DeepSeek-V3 over 4 nodes of 8: 8 groups, 2 per node, top-4 groups.
  auto v3 = model_preset("deepseek-v3");
  ASSERT_TRUE(v3.ok());
  double touched_remote = 0.0;
  int subsets = 0;
  for (int mask = 0; mask < 256; ++mask) {
    if (__builtin_popcount(mask) != 4) continue;
    std::set<int> nodes;
    for (int g = 0; g < 8; ++g) {
      if (mask & (1 << g)) nodes.insert(g / 2);
    }
    nodes.erase(0);  // the sender's node
    touched_remote += nodes.size();
    ++subsets;
  }
  EXPECT_NEAR(expected_remote_nodes_per_token(*v3, 32, 8), touched_remote / subsets, 1e-12);

  // Ungrouped routing: 16 experts, top-2, 4 nodes of 4 experts.
  ModelProfile small = *v3;
  small.num_routed_experts = 16;
  small.experts_per_token = 2;
  small.num_expert_groups = 1;
  small.topk_groups = 1;
  double total = 0.0;
  int pairs = 0;
  for (int a = 0; a < 16; ++a) {
    for (int b = a + 1; b < 16; ++b) {
      std::set<int> nodes{a / 4, b / 4};
      nodes.erase(0);
      total += nodes.size();
      ++pairs;
    }
  }
  EXPECT_NEAR(expected_remote_nodes_per_token(small, 16, 4), total / pairs, 1e-12);
  EXPECT_EQ(expected_remote_nodes_per_token(small, 4, 4), 0.0);  // one node
}

TEST(AllToAll, PartsAddUp) {
  auto hw_set = testing::load_hardware_set();
  const HardwareProfile& hw = hw_set.at("ascend-910c");
  AllToAllCall call;
  call.ranks = 256;
  call.tokens = 128;
  call.copies_per_token = 8;
  call.bytes_per_copy = 7680;
  const AllToAllTime t = all_to_all_time(hw, call);
  EXPECT_DOUBLE_EQ(t.payload_bytes, 128.0 * 8 * 7680);
  EXPECT_DOUBLE_EQ(t.network_bytes, t.payload_bytes * 255 / 256);
  EXPECT_NEAR(t.transfer_s,
              t.network_bytes / (hw.scale_up.bandwidth_gb_s * 1e9 * hw.efficiency.all_to_all),
              1e-15);
  EXPECT_NEAR(t.message_s, 1024 * hw.fixed.all_to_all_per_token_copy_ns * 1e-9, 1e-15);
  EXPECT_NEAR(t.seconds, t.fixed_s + std::max(t.transfer_s, t.message_s), 1e-15);
  call.copy_engine = true;
  EXPECT_EQ(all_to_all_time(hw, call).message_s, 0.0);
  call.ranks = 1;
  EXPECT_EQ(all_to_all_time(hw, call).seconds, 0.0);
}

TEST(Mtp, ExpectedTokensPerStepMatchesDraws) {
  MtpOptions mtp;
  mtp.draft_tokens = 2;
  mtp.acceptance = 0.7;
  EXPECT_DOUBLE_EQ(mtp.tokens_per_step(), 1.0 + 0.7 + 0.49);
  // Monte Carlo with an independent generator: 200k steps, standard error ~0.002.
  DeterministicRandom rng(7);
  double tokens = 0.0;
  const int steps = 200000;
  for (int s = 0; s < steps; ++s) {
    tokens += 1.0;
    for (int d = 0; d < 2 && rng.uniform() < 0.7; ++d) tokens += 1.0;
  }
  EXPECT_NEAR(tokens / steps, mtp.tokens_per_step(), 0.01);
}

OperatorTime op(OperatorStream stream, double compute, double link = 0.0, double fixed = 0.0) {
  OperatorTime o;
  o.name = "op";
  o.stream = stream;
  o.compute_s = compute;
  o.link_s = link;
  o.fixed_s = fixed;
  return o;
}

TEST(LayerEstimate, PartitionedPipelineBalancesTheStreams) {
  const auto a = OperatorStream::kAttention;
  const auto m = OperatorStream::kMoe;
  // Compute only: the balanced split gives A / s = M / (1 - s) = A + M.
  const PipelinePeriod pure = two_stream_period({op(a, 3.0), op(m, 1.0)});
  EXPECT_NEAR(pure.period_s, 4.0, 1e-9);
  EXPECT_NEAR(pure.attention_share, 0.75, 1e-9);
  // With a transfer and fixed cost on the MoE stream the streams still balance, and the
  // period never exceeds running the microbatch back to back.
  const std::vector<OperatorTime> ops = {op(a, 3.0), op(m, 1.0, 2.5, 0.5), op(m, 0.5)};
  const PipelinePeriod p = two_stream_period(ops);
  EXPECT_NEAR(stream_seconds(ops, a, p.attention_share),
              stream_seconds(ops, m, 1.0 - p.attention_share), 1e-6);
  EXPECT_LE(p.period_s, sequential_seconds(ops) + 1e-12);
  EXPECT_GE(p.period_s, 3.0);  // attention alone on the whole device
  // Operator time: fixed + max(link, compute / share).
  EXPECT_DOUBLE_EQ(op(m, 1.0, 2.5, 0.5).seconds(0.25), 0.5 + 4.0);
}

TEST(LayerEstimate, SharedCorePipelineOverlapsTransfers) {
  const auto a = OperatorStream::kAttention;
  const auto m = OperatorStream::kMoe;
  const std::vector<OperatorTime> half = {op(a, 2.0), op(m, 1.0, 1.5, 0.2)};
  const std::vector<OperatorTime> whole = {op(a, 4.0), op(m, 2.0, 3.0, 0.2)};
  const LayerEstimate layer =
      layer_estimate(whole, half, Microbatching::kOn, PipelineKind::kSharedCores);
  EXPECT_DOUBLE_EQ(layer.microbatched_s, 2.0 * std::max(3.0, 1.7));
  EXPECT_DOUBLE_EQ(layer.sequential_s, 4.0 + 0.2 + 3.0);
  EXPECT_TRUE(layer.microbatched);
  const LayerEstimate best =
      layer_estimate(whole, half, Microbatching::kAuto, PipelineKind::kSharedCores);
  EXPECT_DOUBLE_EQ(best.seconds, std::min(best.sequential_s, best.microbatched_s));
}

class DecodeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hardware_ = testing::load_hardware_set();
    ASSERT_TRUE(hardware_.count("ascend-910c"));
    model_ = *model_preset("deepseek-v3");
    deployment_ = *decode_preset("cloudmatrix-decode");
  }
  HardwareSet hardware_;
  ModelProfile model_;
  DecodeDeployment deployment_;
};

TEST_F(DecodeModelTest, StepIsTheSumOfItsParts) {
  const HardwareProfile& hw = hardware_.at("ascend-910c");
  auto e = estimate_decode(model_, hw, deployment_, 48, 4096, 4096);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const double parts = 58 * e->moe_layer.seconds + 3 * e->dense_layer.seconds +
                       e->mtp_layer.seconds + e->lm_head_s + e->fixed_s;
  EXPECT_NEAR(e->step_s, parts, 1e-12);
  EXPECT_NEAR(e->tpot_s * 1.7, e->step_s, 1e-12);
  EXPECT_NEAR(e->throughput_per_package, 96 / e->tpot_s, 1e-9);
  // KV: 48 requests x 4096 tokens x 576 x 2 B x (61 + 1 MTP) layers.
  EXPECT_DOUBLE_EQ(e->memory.kv_bytes, 48.0 * 4096 * 576 * 2 * 62);
  // Back to back equals the operators' sum at the whole batch.
  double sum = 0.0;
  for (const auto& o : e->moe_layer.operators) sum += o.seconds();
  EXPECT_NEAR(e->moe_layer.sequential_s, sum, 1e-15);
}

TEST_F(DecodeModelTest, TpotGrowsWithBatchAndContext) {
  const HardwareProfile& hw = hardware_.at("ascend-910c");
  double previous = 0.0;
  for (double batch : {4.0, 16.0, 48.0, 96.0}) {
    auto e = estimate_decode(model_, hw, deployment_, batch, 4096, 4096);
    ASSERT_TRUE(e.ok());
    EXPECT_GT(e->tpot_s, previous);
    previous = e->tpot_s;
  }
  auto short_context = estimate_decode(model_, hw, deployment_, 48, 1024, 1024);
  auto long_context = estimate_decode(model_, hw, deployment_, 48, 8192, 8192);
  EXPECT_LT(short_context->tpot_s, long_context->tpot_s);
}

TEST_F(DecodeModelTest, LargestBatchUnderSloIsTight) {
  const HardwareProfile& hw = hardware_.at("ascend-910c");
  for (double slo : {0.02, 0.03, 0.05}) {
    auto best = largest_batch_under_slo(model_, hw, deployment_, slo, 4224, 4352);
    ASSERT_TRUE(best.ok());
    ASSERT_TRUE(best->has_value());
    const int b = (*best)->batch_per_device;
    EXPECT_LE((*best)->estimate.tpot_s, slo);
    auto next = estimate_decode(model_, hw, deployment_, b + 1, 4224, 4352);
    EXPECT_TRUE(next->tpot_s > slo || !next->memory.fits());
  }
  // An SLO below the fixed costs admits no batch.
  auto none = largest_batch_under_slo(model_, hw, deployment_, 0.001, 4224, 4352);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST_F(DecodeModelTest, BadDeploymentsAreRejectedWithReasons) {
  const HardwareProfile& hw = hardware_.at("ascend-910c");
  DecodeDeployment d = deployment_;
  d.experts.redundant_experts = 31;  // 287 slots over 288 routed dies
  auto e = estimate_decode(model_, hw, d, 48, 4096, 4096);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("do not divide evenly"), std::string::npos);
  d = deployment_;
  d.mtp.acceptance = 1.5;
  EXPECT_NE(estimate_decode(model_, hw, d, 48, 4096, 4096).status().message().find("acceptance"),
            std::string::npos);
  EXPECT_FALSE(estimate_decode(model_, hw, deployment_, 0, 4096, 4096).ok());
  EXPECT_FALSE(estimate_decode(model_, hw, deployment_, 8, 4096, 100).ok());
  d = deployment_;
  d.precision.weights = Precision::kFp8;  // the 910C has no FP8
  EXPECT_EQ(estimate_decode(model_, hw, d, 8, 4096, 4096).status().code(), StatusCode::kNotFound);
  // Infinite sizes printed "inf us" and "-nan" instances.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(estimate_decode(model_, hw, deployment_, inf, 4096, 4096).ok());
  EXPECT_FALSE(estimate_decode(model_, hw, deployment_, 8, 4096, inf).ok());
  // A bandwidth so small that the step is infinite: an error, not "TPOT inf ms".
  HardwareProfile slow = hw;
  slow.hbm_bandwidth_gb_s = 1e-320;
  const auto infinite = estimate_decode(model_, slow, deployment_, 8, 4096, 4096);
  ASSERT_FALSE(infinite.ok());
  EXPECT_NE(infinite.status().message().find("not a finite time"), std::string::npos)
      << infinite.status().message();
}

// A model without an MTP module cannot draft (kimi-k2 was modelled at 1.7 tokens per step);
// with several modules each draft is still one pass (two modules and two drafts counted 4).
TEST_F(DecodeModelTest, MtpPassesFollowTheDraftsAndNeedAModule) {
  const HardwareProfile& hw = hardware_.at("ascend-910c");
  ModelProfile no_mtp = model_;
  no_mtp.num_mtp_layers = 0;
  const auto refused = estimate_decode(no_mtp, hw, deployment_, 8, 4096, 4096);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no MTP module"), std::string::npos);
  DecodeDeployment two_drafts = deployment_;
  two_drafts.mtp.draft_tokens = 2;
  ModelProfile two_modules = model_;
  two_modules.num_mtp_layers = 2;
  auto one = estimate_decode(model_, hw, two_drafts, 8, 4096, 4096);
  auto two = estimate_decode(two_modules, hw, two_drafts, 8, 4096, 4096);
  ASSERT_TRUE(one.ok() && two.ok());
  const double parts = model_.num_moe_layers() * two->moe_layer.seconds +
                       model_.num_dense_layers * two->dense_layer.seconds +
                       2 * two->mtp_layer.seconds + two->lm_head_s + two->fixed_s;
  EXPECT_NEAR(two->step_s, parts, 1e-12);
  EXPECT_NEAR(one->step_s, two->step_s, 1e-12);
}

TEST(PrefillModel, CausalContextAndCacheHits) {
  // One 4-token prompt attends 1 + 2 + 3 + 4 = 10; with 2 cached, the 2 new attend 3 + 4.
  EXPECT_DOUBLE_EQ(uniform_prefill_batch(1, 4, 0.0).attended_context, 10.0);
  const PrefillBatch cached = uniform_prefill_batch(1, 4, 0.5);
  EXPECT_DOUBLE_EQ(cached.attended_context, 7.0);
  EXPECT_DOUBLE_EQ(cached.new_tokens, 2.0);
  EXPECT_DOUBLE_EQ(cached.cached_tokens, 2.0);

  auto hardware = testing::load_hardware_set();
  const HardwareProfile& hw = hardware.at("ascend-910c");
  auto model = *model_preset("deepseek-v3");
  auto deployment = *prefill_preset("cloudmatrix-prefill");
  double previous = 1e300;
  for (double reuse : {0.0, 0.25, 0.5, 0.9}) {
    auto e = estimate_prefill(model, hw, deployment, uniform_prefill_batch(2, 4096, reuse));
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_LT(e->batch_s, previous);  // on UB, reuse always pays
    previous = e->batch_s;
    EXPECT_NEAR(e->throughput_per_device, 8192 / e->batch_s, 1e-6);
  }
  auto missing_path = estimate_prefill(model, hw, deployment, uniform_prefill_batch(2, 4096, 0.5),
                                       "carrier-pigeon");
  ASSERT_FALSE(missing_path.ok());
  EXPECT_NE(missing_path.status().message().find("ub, vpc"), std::string::npos);
  deployment.attention_tp = 5;
  EXPECT_FALSE(estimate_prefill(model, hw, deployment, uniform_prefill_batch(2, 4096, 0)).ok());
}

ExpertRoutingLoad uniform_load(int experts, int layers) {
  ExpertRoutingLoad load;
  load.num_experts = experts;
  for (int l = 0; l < layers; ++l) {
    load.moe_layers.push_back(l);
    load.counts.push_back(std::vector<double>(experts, 100.0));
  }
  return load;
}

// Hand-computed placements.
TEST(RoutingImbalance, HandCases) {
  auto v3 = *model_preset("deepseek-v3");
  // Uniform routing, 256 experts on 288 dies with one slot each: 32 experts get a second
  // replica at half load; busiest die L, mean 256 L / 288: 1.125.
  ExpertPlacement cloudmatrix;
  cloudmatrix.devices = 320;
  cloudmatrix.redundant_experts = 32;
  cloudmatrix.shared_expert_devices = 32;
  auto cm = routing_imbalance(uniform_load(256, 3), v3, cloudmatrix);
  ASSERT_TRUE(cm.ok()) << cm.status().to_string();
  EXPECT_NEAR(cm->mean_max_over_mean, 1.125, 1e-12);
  // 32 ranks x 9 slots: 7 full experts + 2 half replicas on every rank: perfectly even.
  ExpertPlacement prefill;
  prefill.devices = 32;
  prefill.redundant_experts = 32;
  EXPECT_NEAR(routing_imbalance(uniform_load(256, 2), v3, prefill)->mean_max_over_mean, 1.0, 1e-12);
  // 4 experts on 2 ranks x 2 slots, loads 5,1,1,1: 5 -> r0; 1, 1 -> r1 (then full); 1 -> r0:
  // loads 6 and 2, max / mean = 6 / 4.
  ModelProfile small = v3;
  small.num_routed_experts = 4;
  small.experts_per_token = 1;
  ExpertRoutingLoad load;
  load.num_experts = 4;
  load.moe_layers = {3};
  load.counts = {{5, 1, 1, 1}};
  ExpertPlacement two;
  two.devices = 2;
  EXPECT_NEAR(routing_imbalance(load, small, two)->mean_max_over_mean, 1.5, 1e-12);
  EXPECT_FALSE(routing_imbalance(uniform_load(128, 1), v3, prefill).ok());  // wrong experts
}

TEST(RoutingImbalance, SkewShowsWithoutRedundancy) {
  auto v3 = *model_preset("deepseek-v3");
  ExpertPlacement ep32;  // 8 experts per rank, no redundant slots
  ep32.devices = 32;
  std::vector<double> imbalance;
  for (double hottest : {1.0, 8.0}) {
    auto load = skewed_routing_load(v3, hottest, 1e6, 1);
    ASSERT_TRUE(load.ok()) << load.status().to_string();
    // The hottest expert is chosen `hottest` times as often as the mean one.
    const auto& counts = load->counts[0];
    EXPECT_NEAR(*std::max_element(counts.begin(), counts.end()) / (1e6 / 256), hottest, 1e-6);
    imbalance.push_back(routing_imbalance(*load, v3, ep32)->mean_max_over_mean);
  }
  EXPECT_NEAR(imbalance[0], 1.0, 1e-12);  // uniform: 8 equal experts on every rank
  // Skewed experts without replicas cannot be packed evenly, eight to a rank.
  EXPECT_GT(imbalance[1], 1.01);
  EXPECT_FALSE(skewed_routing_load(v3, 0.5, 1e6, 1).ok());
}

TEST(ModelLoading, Table2Arithmetic) {
  ModelLoadingScenario s;
  s.model_bytes = 671e9;
  s.instances = 8;
  s.devices_per_instance = 96;
  s.storage_bandwidth_gb_s = 2.5;
  s.pool_bandwidth_gb_s = 1.0;
  s.distinct_models = 8;
  auto r = model_loading(s);
  ASSERT_TRUE(r.ok());
  const double pull = 671.0 / 2.5;
  const double warm = 671.0 / 96.0;
  EXPECT_DOUBLE_EQ(r->no_cache.cold_start_s, 8 * pull);
  EXPECT_DOUBLE_EQ(r->memory_pool.cold_start_s, pull);
  EXPECT_DOUBLE_EQ(r->memory_pool.warm_start_s, warm);
  EXPECT_LT(r->no_cache.warm_start_s, 0.0);
  EXPECT_DOUBLE_EQ(r->local_dram.dram_models, 8);
  EXPECT_DOUBLE_EQ(r->local_dram.switch_latency_s, warm / 8 + pull * 7 / 8);
  s.instances = 0;
  EXPECT_FALSE(model_loading(s).ok());
}

TEST(PdRatio, HandExample) {
  PrefillEstimate prefill;
  prefill.batch.new_tokens = 2 * 4096;  // 2 requests of 4096 per device
  prefill.batch_s = 2.0;
  DecodeEstimate decode;
  decode.batch_per_device = 48;
  decode.tpot_s = 0.05;
  // Prefill: 32 devices x 2 requests / 2 s = 32 req/s; decode: 48 x 320 / (256 x 0.05 s)
  // = 1200 req/s; 37.5 prefill instances per decode instance.
  auto r = recommend_pd_ratio({4096, 256, 0}, prefill, 32, decode, 320, 32 * 37 + 320);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->prefill_requests_per_s, 32.0);
  EXPECT_DOUBLE_EQ(r->decode_requests_per_s, 1200.0);
  EXPECT_DOUBLE_EQ(r->prefill_per_decode, 37.5);
  EXPECT_EQ(r->decode_instances, 1);
  EXPECT_EQ(r->prefill_instances, 37);
  EXPECT_DOUBLE_EQ(r->served_requests_per_s, 37 * 32.0);
  EXPECT_FALSE(recommend_pd_ratio({4096, 256, 0}, prefill, 32, decode, 320, 100).ok());
  // A budget near 2^31 overflowed d * devices and never ended; now bounded and refused.
  const auto huge = recommend_pd_ratio({4096, 256, 0}, prefill, 32, decode, 320, 2147483647);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("expected at most"), std::string::npos);
  const auto largest = recommend_pd_ratio({4096, 256, 0}, prefill, 1, decode, 1, kMaxDevices);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(largest->prefill_instances + largest->decode_instances, kMaxDevices);
}

}  // namespace
}  // namespace peerserve::plan
