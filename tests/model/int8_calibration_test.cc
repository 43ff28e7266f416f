// The INT8 calibration pipeline (model/int8_calibration.h, `peerserve quantize --calib`):
// smoothing alone is an exact transform of the BF16 model (the same logits and routing),
// no step raises a group's objective over round to nearest, and the calibrated checkpoints
// load and stay close to BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernels/int8_matrix.h"
#include "model/checkpoint/checkpoint.h"
#include "model/deepseek_model.h"
#include "model/expert_backend.h"
#include "model/int8_calibration.h"
#include "model/int8_checkpoint.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using testing::load_model;
using testing::make_cache;
using testing::make_temp_dir;
using testing::max_rel_diff;
using testing::sequence_logits;
using testing::test_tokens;
using testing::tiny_checkpoint_dir;

ModelOptions bf16_options() {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kBf16;
  o.load_mtp = false;
  return o;
}

// Records every routing decision the model makes.
class RoutingRecorder final : public ExpertBackend {
 public:
  explicit RoutingRecorder(std::shared_ptr<ExpertBackend> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Call> new_call(int slot) override { return inner_->new_call(slot); }
  Status dispatch(const RoutedTokens& tokens, Call& call) override {
    ids.insert(ids.end(), tokens.expert_ids.begin(), tokens.expert_ids.end());
    return inner_->dispatch(tokens, call);
  }
  Status compute(Call& call) override { return inner_->compute(call); }
  Status combine(Call& call, std::span<float> out) override { return inner_->combine(call, out); }
  std::vector<int32_t> ids;

 private:
  std::shared_ptr<ExpertBackend> inner_;
};

Int8Transforms calibrated(const std::string& pipeline, bool guard = true,
                          const std::string& dir = tiny_checkpoint_dir()) {
  auto checkpoint = Checkpoint::open(dir);
  PS_CHECK(checkpoint.ok());
  const std::vector<int32_t> tokens = test_tokens(400, checkpoint->config().vocab_size, 11);
  CalibrationOptions o;
  o.pipeline = parse_int8_pipeline(pipeline).value();
  o.window = 64;
  o.max_sample_rows = 64;
  o.num_threads = 2;
  o.guard = guard;
  auto t = calibrate_int8(dir, tokens, 0, o);
  PS_CHECK(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::string write(const Int8Transforms& transforms, const std::string& tag, bool quantize) {
  const std::string out = make_temp_dir(tag);
  Int8CheckpointOptions o;
  o.transforms = &transforms;
  o.quantize_weights = quantize;
  auto summary = write_int8_checkpoint(tiny_checkpoint_dir(), out, o);
  PS_CHECK(summary.ok()) << summary.status().to_string();
  return out;
}

TEST(Int8CalibrationTest, PipelineNames) {
  EXPECT_FALSE(parse_int8_pipeline("rtn")->any());
  EXPECT_TRUE(parse_int8_pipeline("smooth")->smooth);
  EXPECT_TRUE(parse_int8_pipeline("full")->scale_search);
  EXPECT_TRUE(parse_int8_pipeline("full")->clip);
  EXPECT_FALSE(parse_int8_pipeline("clip")->scale_search);
  EXPECT_FALSE(parse_int8_pipeline("full")->compensate);
  auto all = parse_int8_pipeline("full+compensate");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->scale_search && all->clip && all->compensate && !all->smooth);
  auto sc = parse_int8_pipeline("smooth+clip");
  ASSERT_TRUE(sc.ok());
  EXPECT_TRUE(sc->smooth && sc->clip && !sc->scale_search && !sc->compensate);
  EXPECT_TRUE(parse_int8_pipeline("compensate")->compensate);
  EXPECT_FALSE(parse_int8_pipeline("awq").ok());
  for (const char* bad : {"", "full+", "+clip", "clip++smooth", "rtn+clip", "clip+awq"}) {
    auto r = parse_int8_pipeline(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("compensate"), std::string::npos);
    }
  }
}

// Error compensation: kept only for weights whose held-out sample error it lowers, never on
// gate/up (fused SiLU), one value per output row; the checkpoint stores exactly those and
// loads.
TEST(Int8CalibrationTest, ErrorCompensationIsKeptWhereItPaysAndStored) {
  const Int8Transforms t = calibrated("compensate");
  ASSERT_FALSE(t.compensation.empty());
  int64_t kept = 0;
  double before = 0, after = 0;
  for (const CalibrationGroupReport& g : t.groups) {
    EXPECT_LE(g.compensation_after, g.compensation_before) << g.name;
    kept += g.compensated_weights;
    before += g.compensation_before;
    after += g.compensation_after;
  }
  EXPECT_EQ(kept, static_cast<int64_t>(t.compensation.size()));
  EXPECT_LT(after, before);
  auto source = Checkpoint::open(tiny_checkpoint_dir());
  ASSERT_TRUE(source.ok());
  for (const auto& [name, c] : t.compensation) {
    EXPECT_FALSE(name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight")) << name;
    auto info = source->info(name);
    ASSERT_TRUE(info.ok()) << name;
    EXPECT_EQ(static_cast<int64_t>(c.size()), info->shape[0]) << name;
  }
  const std::string out = write(t, "int8_compensated", /*quantize=*/true);
  auto ckpt = Checkpoint::open(out);
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
  int64_t stored = 0;
  for (const std::string& name : ckpt->tensor_names()) {
    if (!name.ends_with("_compensation")) continue;
    ++stored;
    const std::string weight = name.substr(0, name.size() - std::string("_compensation").size());
    ASSERT_TRUE(t.compensation.contains(weight)) << name;
    auto q = ckpt->get_int8(weight, ckpt->info(weight)->shape);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->compensation, t.compensation.at(weight)) << name;
  }
  EXPECT_EQ(stored, static_cast<int64_t>(t.compensation.size()));
  auto model = load_model(out, bf16_options());
  const std::vector<float> logits =
      sequence_logits(*model, test_tokens(9, model->config().vocab_size, 4));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// Smoothing with power-of-two scales folded into the norms and the router is exact: the
// transformed BF16 model gives bitwise the same logits and routes every token the same.
// (Unguarded: the random test weights have no outliers, so the guarded pipeline keeps few.)
TEST(Int8CalibrationTest, SmoothingAloneIsExact) {
  const Int8Transforms t = calibrated("smooth", /*guard=*/false);
  ASSERT_GE(t.norm_divisor.size(), 4u);  // every group that saw tokens
  bool router = false;
  for (const auto& [name, s] : t.column_scale) router |= name.ends_with("mlp.gate.weight");
  EXPECT_TRUE(router);
  const std::string smoothed = write(t, "int8_smoothed_bf16", /*quantize=*/false);
  auto source_ckpt = Checkpoint::open(tiny_checkpoint_dir());
  auto smoothed_ckpt = Checkpoint::open(smoothed);
  ASSERT_TRUE(smoothed_ckpt.ok() && source_ckpt.ok());
  EXPECT_FALSE(smoothed_ckpt->config().int8_weights);
  for (const auto& [name, s] : t.norm_divisor) {  // norms keep their dtype
    EXPECT_EQ(smoothed_ckpt->info(name)->dtype, source_ckpt->info(name)->dtype) << name;
  }
  auto a = load_model(tiny_checkpoint_dir(), bf16_options());
  auto b = load_model(smoothed, bf16_options());
  auto ra = std::make_shared<RoutingRecorder>(a->expert_backend());
  auto rb = std::make_shared<RoutingRecorder>(b->expert_backend());
  a->set_expert_backend(ra);
  b->set_expert_backend(rb);
  const std::vector<int32_t> tokens = test_tokens(37, a->config().vocab_size, 3);
  const std::vector<float> la = sequence_logits(*a, tokens);
  const std::vector<float> lb = sequence_logits(*b, tokens);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0)
      << "max rel diff " << max_rel_diff(la, lb);
  ASSERT_FALSE(ra->ids.empty());
  EXPECT_EQ(ra->ids, rb->ids);
}

// The MTP layer's drafts of the smoothed model are the source's, bit for bit: its input is
// the final norm's output, so that norm is never smoothed while the model has an MTP layer.
TEST(Int8CalibrationTest, SmoothingLeavesTheMtpDraftsExact) {
  const Int8Transforms t = calibrated("smooth", /*guard=*/false);
  EXPECT_EQ(t.norm_divisor.count("model.norm.weight"), 0u);
  const std::string smoothed = write(t, "int8_smoothed_mtp", /*quantize=*/false);
  ModelOptions options = bf16_options();
  options.load_mtp = true;
  auto a = load_model(tiny_checkpoint_dir(), options);
  auto b = load_model(smoothed, options);
  ASSERT_TRUE(a->has_mtp() && b->has_mtp());
  const std::vector<int32_t> tokens = test_tokens(30, a->config().vocab_size, 5);
  auto drafts = [&](DeepseekModel& model) {
    LatentKvCache cache = make_cache(model, 16, DType::kBF16, 4);
    const std::vector<int32_t> table = {0, 1};
    std::vector<SequenceChunk> chunks(1);
    chunks[0].tokens = std::span<const int32_t>(tokens).first(29);
    chunks[0].block_table = table;
    chunks[0].all_hidden = true;
    ForwardOutput out, draft;
    PS_CHECK(model.forward(chunks, cache, &out).ok());
    MtpChunk mtp;
    mtp.next_tokens = std::span<const int32_t>(tokens).subspan(1, 29);
    mtp.hidden = out.hidden;
    mtp.block_table = table;
    mtp.all_logits = true;
    PS_CHECK(model.forward_mtp({&mtp, 1}, cache, &draft).ok());
    return draft.logits;
  };
  const std::vector<float> da = drafts(*a), db = drafts(*b);
  ASSERT_EQ(da.size(), db.size());
  ASSERT_FALSE(da.empty());
  EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size() * sizeof(float)), 0)
      << "max rel diff " << max_rel_diff(da, db);
}

// A copy of the tiny checkpoint whose shard headers are one byte longer (a space after the
// JSON, as the format allows): every tensor's data then starts at an odd address, and BF16
// tensors are read through converted copies instead of the mapping.
std::string misaligned_copy() {
  namespace fs = std::filesystem;
  const std::string dir = testing::make_temp_dir("calib_misaligned");
  for (const auto& entry : fs::directory_iterator(tiny_checkpoint_dir())) {
    const fs::path to = fs::path(dir) / entry.path().filename();
    if (entry.path().extension() != ".safetensors") {
      fs::copy_file(entry.path(), to);
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    PS_CHECK((8 + header) % 2 == 0);
    bytes.insert(8 + header, " ");
    ++header;
    std::memcpy(bytes.data(), &header, 8);
    std::ofstream(to, std::ios::binary) << bytes;
  }
  return dir;
}

// Calibration identifies a weight by its BF16 data. With misaligned tensors (converted
// copies) it used to find no weight: every group but the MoE ones was left at round to
// nearest, silently. It now chooses exactly what it chooses on the aligned checkpoint.
TEST(Int8CalibrationTest, MisalignedTensorsAreCalibratedLikeAlignedOnes) {
  const Int8Transforms aligned = calibrated("smooth", /*guard=*/false);
  const Int8Transforms misaligned = calibrated("smooth", /*guard=*/false, misaligned_copy());
  ASSERT_GE(aligned.norm_divisor.size(), 4u);
  auto same = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [name, values] : a) {
      const auto it = b.find(name);
      if (it == b.end() || *it->second != *values) return false;
    }
    return true;
  };
  EXPECT_TRUE(same(misaligned.norm_divisor, aligned.norm_divisor))
      << misaligned.norm_divisor.size() << " norms smoothed, " << aligned.norm_divisor.size()
      << " when aligned";
  EXPECT_TRUE(same(misaligned.column_scale, aligned.column_scale));
}

// Every step keeps or lowers each group's objective against round to nearest; the search
// (whose grid holds 0.5) is never worse than plain smoothing.
TEST(Int8CalibrationTest, NoStepRaisesTheObjective) {
  const Int8Transforms smooth = calibrated("smooth");
  const Int8Transforms search = calibrated("search");
  const Int8Transforms clip = calibrated("clip");
  const Int8Transforms full = calibrated("full");
  for (const Int8Transforms* t : {&smooth, &search, &clip, &full}) {
    ASSERT_FALSE(t->groups.empty());
    for (const CalibrationGroupReport& g : t->groups) {
      EXPECT_GT(g.reference, 0) << g.name;
      EXPECT_LE(g.smoothed_error, g.rtn_error) << g.name;
      EXPECT_LE(g.error, g.smoothed_error) << g.name;
    }
  }
  ASSERT_EQ(smooth.groups.size(), search.groups.size());
  double rtn = 0, after = 0;
  for (size_t i = 0; i < smooth.groups.size(); ++i) {
    ASSERT_EQ(smooth.groups[i].name, search.groups[i].name);
    EXPECT_EQ(smooth.groups[i].rtn_error, search.groups[i].rtn_error);
    EXPECT_LE(search.groups[i].error, smooth.groups[i].error) << search.groups[i].name;
  }
  for (const CalibrationGroupReport& g : full.groups) {
    rtn += g.rtn_error;
    after += g.error;
  }
  EXPECT_LT(after, rtn);  // the pipeline found something on this model
  // Clipping covers the weights outside the norm groups too (o_proj, down_proj).
  EXPECT_GT(clip.groups.size(), search.groups.size());
  EXPECT_FALSE(full.row_clip.empty());
}

// The calibrated checkpoints load (the loader needs no change) and stay close to BF16.
TEST(Int8CalibrationTest, CalibratedCheckpointsLoad) {
  auto bf16 = load_model(tiny_checkpoint_dir(), bf16_options());
  const std::vector<int32_t> tokens = test_tokens(29, bf16->config().vocab_size, 9);
  const std::vector<float> reference = sequence_logits(*bf16, tokens);
  for (const char* pipeline : {"smooth", "clip", "full"}) {
    SCOPED_TRACE(pipeline);
    const std::string dir = write(calibrated(pipeline), std::string("int8_calib_") + pipeline,
                                  /*quantize=*/true);
    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.ok());
    EXPECT_TRUE(ckpt->config().int8_weights);
    EXPECT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
    auto model = load_model(dir, bf16_options());
    const std::vector<float> logits = sequence_logits(*model, tokens);
    ASSERT_EQ(logits.size(), reference.size());
    EXPECT_LT(max_rel_diff(reference, logits), 0.1);
    EXPECT_NE(std::memcmp(logits.data(), reference.data(), logits.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace peerserve
