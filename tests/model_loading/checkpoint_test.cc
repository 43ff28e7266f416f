#include "model/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_model.h"
#include "tests/model_loading/fifo_in_place.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve {
namespace {

using testing::ScratchDir;

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

std::vector<std::byte> bf16_bytes(size_t n, float value) {
  std::vector<std::byte> out(n * 2);
  const uint16_t bits = float_to_bf16(value).bits;
  for (size_t i = 0; i < n; ++i) std::memcpy(out.data() + 2 * i, &bits, 2);
  return out;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every layout tensor as BF16 (value 0.5), as TensorToWrite.
std::vector<TensorToWrite> layout_tensors(const ModelConfig& config) {
  std::vector<TensorToWrite> out;
  for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
    out.push_back({spec.name, DType::kBF16, spec.shape,
                   bf16_bytes(static_cast<size_t>(numel(spec.shape)), 0.5f)});
  }
  return out;
}

// A single-file checkpoint: config.json + model.safetensors.
void write_single_file_checkpoint(const ScratchDir& dir, const ModelConfig& config,
                                  const std::vector<TensorToWrite>& tensors) {
  testing::write_file_bytes(dir.file("config.json"), model_config_to_json(config));
  ASSERT_TRUE(write_safetensors_file(dir.file("model.safetensors"), tensors).ok());
}

ModelConfig tiny_config() {
  return test_model_config(TestModelPreset::kTiny, false);
}

TensorToWrite* find(std::vector<TensorToWrite>& tensors, const std::string& name) {
  for (TensorToWrite& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

class TinyCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<ScratchDir>();
    fp8_dir_ = std::make_unique<ScratchDir>();
    TestModelOptions options;
    options.seed = 3;
    ASSERT_TRUE(write_test_model(dir_->path(), options).ok());
    options.fp8 = true;
    ASSERT_TRUE(write_test_model(fp8_dir_->path(), options).ok());
  }
  static void TearDownTestSuite() {
    dir_.reset();
    fp8_dir_.reset();
  }
  static std::unique_ptr<ScratchDir> dir_;
  static std::unique_ptr<ScratchDir> fp8_dir_;
};
std::unique_ptr<ScratchDir> TinyCheckpointTest::dir_;
std::unique_ptr<ScratchDir> TinyCheckpointTest::fp8_dir_;

TEST_F(TinyCheckpointTest, OpensValidatesAndLoadsEveryTensor) {
  Result<Checkpoint> ckpt = Checkpoint::open(dir_->path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(ckpt->config());
  EXPECT_EQ(ckpt->tensor_names().size(), layout.size());
  EXPECT_EQ(ckpt->unused_tensors().size(), layout.size());
  EXPECT_FALSE(ckpt->check_all_used().ok());
  for (const TensorSpec& spec : layout) {
    if (spec.role == TensorRole::kNorm || spec.role == TensorRole::kRouterBias) {
      Result<std::vector<float>> v = ckpt->get_f32(spec.name, spec.shape);
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      EXPECT_EQ(v->size(), static_cast<size_t>(numel(spec.shape)));
    } else {
      Result<WeightTensor> w = ckpt->get_bf16(spec.name, spec.shape);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      EXPECT_TRUE(w->zero_copy) << spec.name;
    }
  }
  EXPECT_TRUE(ckpt->unused_tensors().empty());
  EXPECT_TRUE(ckpt->check_all_used().ok());
}

TEST_F(TinyCheckpointTest, MtpLayerIsPresent) {
  Result<Checkpoint> ckpt = Checkpoint::open(dir_->path());
  ASSERT_TRUE(ckpt.ok());
  const int64_t L = ckpt->config().num_hidden_layers;
  const int64_t h = ckpt->config().hidden_size, v = ckpt->config().vocab_size;
  const std::string p = "model.layers." + std::to_string(L) + ".";
  EXPECT_TRUE(ckpt->get_bf16(p + "embed_tokens.weight", {v, h}).ok());
  EXPECT_TRUE(ckpt->get_f32(p + "enorm.weight", {h}).ok());
  EXPECT_TRUE(ckpt->get_f32(p + "hnorm.weight", {h}).ok());
  EXPECT_TRUE(ckpt->get_bf16(p + "eh_proj.weight", {h, 2 * h}).ok());
  EXPECT_TRUE(ckpt->get_f32(p + "shared_head.norm.weight", {h}).ok());
  EXPECT_TRUE(ckpt->get_bf16(p + "shared_head.head.weight", {v, h}).ok());
  EXPECT_TRUE(ckpt->get_bf16(p + "mlp.experts.7.down_proj.weight",
                             {h, ckpt->config().moe_intermediate_size})
                  .ok());
  EXPECT_TRUE(ckpt->contains(p + "mlp.gate.e_score_correction_bias"));
  Result<CheckpointTensorInfo> bias = ckpt->info(p + "mlp.gate.e_score_correction_bias");
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->dtype, DType::kF32);
}

TEST_F(TinyCheckpointTest, ZeroCopyTensorOutlivesCheckpoint) {
  WeightTensor w;
  std::vector<uint16_t> copy;
  {
    Result<Checkpoint> ckpt = Checkpoint::open(dir_->path());
    ASSERT_TRUE(ckpt.ok());
    const ModelConfig& c = ckpt->config();
    Result<WeightTensor> r =
        ckpt->get_bf16("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
    ASSERT_TRUE(r.ok());
    w = *r;
    EXPECT_TRUE(w.zero_copy);
    EXPECT_EQ(w.dtype, DType::kBF16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % 2, 0u);
    for (int64_t i = 0; i < w.numel(); ++i) copy.push_back(w.bf16_data()[i].bits);
  }
  // The mapping is kept alive by the tensor's storage.
  for (int64_t i = 0; i < w.numel(); ++i)
    ASSERT_EQ(w.bf16_data()[i].bits, copy[static_cast<size_t>(i)]);
}

TEST_F(TinyCheckpointTest, ReleasedPagesStayReadableAndOtherMemoryIsLeftAlone) {
  Result<Checkpoint> ckpt = Checkpoint::open(dir_->path());
  ASSERT_TRUE(ckpt.ok());
  const ModelConfig& c = ckpt->config();
  Result<WeightTensor> w =
      ckpt->get_bf16("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->zero_copy);
  std::vector<uint16_t> copy;
  for (int64_t i = 0; i < w->numel(); ++i) copy.push_back(w->bf16_data()[i].bits);
  // Released pages of the mapping are read from the file again.
  ckpt->release_pages(w->data, static_cast<size_t>(w->nbytes()));
  for (int64_t i = 0; i < w->numel(); ++i)
    ASSERT_EQ(w->bf16_data()[i].bits, copy[static_cast<size_t>(i)]) << i;
  // Memory outside the mapping (here: a heap copy, as FP8 weights are dequantized into) is
  // not touched: dropping anonymous pages would zero them.
  std::vector<uint16_t> owned(copy);
  ckpt->release_pages(owned.data(), owned.size() * sizeof(uint16_t));
  EXPECT_EQ(owned, copy);
  // A range that starts inside the mapping but runs past its end is not released either.
  ckpt->release_pages(w->data, std::numeric_limits<size_t>::max());
  for (int64_t i = 0; i < w->numel(); ++i)
    ASSERT_EQ(w->bf16_data()[i].bits, copy[static_cast<size_t>(i)]) << i;
}

// The FP8 variant draws the same random values (per-tensor streams), so its dequantized
// weights match the BF16 variant within E4M3 precision: relative 2^-4 per element plus the
// subnormal floor of its block (2^-10 * block scale, with scale = block amax / 448 <= 0.2/448
// for std-0.02 normals) and BF16 rounding of both sides.
TEST_F(TinyCheckpointTest, Fp8MatchesBf16WithinE4M3Precision) {
  Result<Checkpoint> fp8 = Checkpoint::open(fp8_dir_->path());
  Result<Checkpoint> ref = Checkpoint::open(dir_->path());
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(fp8->validate_layout().ok()) << fp8->validate_layout().to_string();
  EXPECT_EQ(fp8->config().fp8_block_rows, std::optional<int64_t>(32));
  int fp8_tensors = 0;
  for (const TensorSpec& spec : deepseek_tensor_layout(fp8->config())) {
    Result<WeightTensor> a = fp8->get_bf16(spec.name, spec.shape);
    Result<WeightTensor> b = ref->get_bf16(spec.name, spec.shape);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    if (is_fp8_quantizable(spec.role)) {
      ++fp8_tensors;
      EXPECT_FALSE(a->zero_copy);
      EXPECT_EQ(fp8->info(spec.name)->dtype, DType::kF8E4M3);
    }
    for (int64_t i = 0; i < a->numel(); ++i) {
      const float x = bf16_to_float(a->bf16_data()[i]), y = bf16_to_float(b->bf16_data()[i]);
      ASSERT_NEAR(x, y, std::fabs(y) * (0.0625 + 0.008) + 1e-6) << spec.name << " [" << i << "]";
    }
  }
  EXPECT_GT(fp8_tensors, 50);
  EXPECT_TRUE(fp8->check_all_used().ok()) << fp8->check_all_used().to_string();
}

TEST_F(TinyCheckpointTest, ReportsProgressUpToTotal) {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  CheckpointOptions options;
  options.progress = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
  options.prefetch = true;
  Result<Checkpoint> ckpt = Checkpoint::open(dir_->path(), options);
  ASSERT_TRUE(ckpt.ok());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().first, calls.back().second);  // prefetch reached 100%
  calls.clear();
  for (const TensorSpec& spec : deepseek_tensor_layout(ckpt->config())) {
    ASSERT_TRUE(ckpt->get_raw(spec.name).ok());
  }
  ASSERT_FALSE(calls.empty());
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i].first, calls[i - 1].first);
  EXPECT_EQ(calls.back().first, ckpt->total_tensor_bytes());
  EXPECT_EQ(calls.back().second, ckpt->total_tensor_bytes());
}

TEST_F(TinyCheckpointTest, ConcurrentLoadsMarkEverythingUsed) {
  Result<Checkpoint> ckpt = Checkpoint::open(dir_->path());
  ASSERT_TRUE(ckpt.ok());
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(ckpt->config());
  Checkpoint& c = *ckpt;
  auto load = [&](size_t first) {
    for (size_t i = first; i < layout.size(); i += 2) {
      ASSERT_TRUE(c.get_bf16(layout[i].name, layout[i].shape).ok());
    }
  };
  std::thread a(load, 0), b(load, 1);
  a.join();
  b.join();
  EXPECT_TRUE(c.check_all_used().ok());
}

TEST(CheckpointTest, ConvertsF32AndF16AndReadsSingleFile) {
  ScratchDir dir;
  const ModelConfig config = tiny_config();
  std::vector<TensorToWrite> tensors = layout_tensors(config);
  // F32 norm: values that need rounding to BF16.
  TensorToWrite* norm = find(tensors, "model.norm.weight");
  const int64_t h = config.hidden_size;
  std::vector<float> norm_values(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i) norm_values[static_cast<size_t>(i)] = 1.0f + 0.001f * i + 1e-6f;
  norm->dtype = DType::kF32;
  norm->bytes.resize(norm_values.size() * 4);
  std::memcpy(norm->bytes.data(), norm_values.data(), norm->bytes.size());
  // F16 embedding with hand-encoded halves: 1.0, -2.5, 65504, 2^-24 (subnormal), 0.
  TensorToWrite* embed = find(tensors, "model.embed_tokens.weight");
  const uint16_t halves[5] = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x0000};
  const float expected[5] = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), 0.0f};
  embed->dtype = DType::kF16;
  for (size_t i = 0; i < embed->bytes.size() / 2; ++i) {
    std::memcpy(embed->bytes.data() + 2 * i, &halves[i % 5], 2);
  }
  write_single_file_checkpoint(dir, config, tensors);

  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
  Result<std::vector<float>> f = ckpt->get_f32("model.norm.weight", {h});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, norm_values);  // F32 read exactly
  Result<WeightTensor> nb = ckpt->get_bf16("model.norm.weight", {h});
  ASSERT_TRUE(nb.ok());
  EXPECT_FALSE(nb->zero_copy);
  for (int64_t i = 0; i < h; ++i) {
    EXPECT_EQ(nb->bf16_data()[i].bits, float_to_bf16(norm_values[static_cast<size_t>(i)]).bits);
  }
  Result<WeightTensor> e = ckpt->get_bf16("model.embed_tokens.weight", {config.vocab_size, h});
  ASSERT_TRUE(e.ok());
  for (int64_t i = 0; i < 20; ++i) {
    // The exact half values, rounded to BF16 (65504 needs 11 significant bits).
    EXPECT_EQ(e->bf16_data()[i].bits, float_to_bf16(expected[i % 5]).bits) << i;
  }
  Result<std::vector<float>> ef =
      ckpt->get_f32("model.embed_tokens.weight", {config.vocab_size, h});
  ASSERT_TRUE(ef.ok());
  for (int64_t i = 0; i < 20; ++i) {
    // get_f32 widens the halves exactly: 65504 keeps its 11 significant bits.
    EXPECT_EQ((*ef)[i], expected[i % 5]) << i;
  }
}

// A non-finite value in a tensor read as float (a norm, the router, a weight `quantize`
// rounds) is refused, naming the tensor and the position; get_bf16 is not checked (see
// kernels/matmul_int8.h: NaN rows stay NaN).
TEST(CheckpointTest, NonFiniteFloatValuesAreRefusedNamingWhere) {
  ScratchDir dir;
  const ModelConfig config = tiny_config();
  std::vector<TensorToWrite> tensors = layout_tensors(config);
  TensorToWrite* norm = find(tensors, "model.norm.weight");
  const uint16_t nan_bits = 0x7fc0, inf_bits = 0xff80;  // BF16 NaN and -inf
  std::memcpy(norm->bytes.data() + 2 * 3, &nan_bits, 2);
  TensorToWrite* embed = find(tensors, "model.embed_tokens.weight");
  std::memcpy(embed->bytes.data() + 2 * (config.hidden_size + 2), &inf_bits, 2);
  write_single_file_checkpoint(dir, config, tensors);
  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const Status norm_status = ckpt->get_f32("model.norm.weight", {config.hidden_size}).status();
  EXPECT_TRUE(contains(norm_status.message(),
                       "tensor 'model.norm.weight' has a non-finite value (nan) at [3]"))
      << norm_status.message();
  const Status embed_status =
      ckpt->get_f32("model.embed_tokens.weight", {config.vocab_size, config.hidden_size}).status();
  EXPECT_TRUE(
      contains(embed_status.message(),
               "tensor 'model.embed_tokens.weight' has a non-finite value (-inf) at [1, 2]"))
      << embed_status.message();
}

// A 1-byte tensor first shifts every following tensor to an odd address: BF16 views would be
// misaligned, so they are copied instead (same values).
TEST(CheckpointTest, MisalignedBf16IsCopied) {
  ScratchDir dir;
  const ModelConfig config = tiny_config();
  std::vector<TensorToWrite> tensors = layout_tensors(config);
  tensors.insert(tensors.begin(), {"aaa.odd", DType::kU8, {1}, {std::byte{7}}});
  write_single_file_checkpoint(dir, config, tensors);
  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  Result<WeightTensor> w = ckpt->get_bf16("model.norm.weight", {config.hidden_size});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_FALSE(w->zero_copy);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 2, 0u);
  for (int64_t i = 0; i < w->numel(); ++i) EXPECT_EQ(bf16_to_float(w->bf16_data()[i]), 0.5f);
  Result<WeightTensor> raw = ckpt->get_raw("aaa.odd");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*static_cast<const std::byte*>(raw->data), std::byte{7});
}

TEST(CheckpointTest, ShapeMismatchNamesFileTensorAndShapes) {
  ScratchDir dir;
  const ModelConfig config = tiny_config();
  write_single_file_checkpoint(dir, config, layout_tensors(config));
  Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const Status s = ckpt->get_bf16("model.norm.weight", {65}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), dir.file("model.safetensors") +
                                        ": tensor 'model.norm.weight' has shape [64], "
                                        "expected [65]"))
      << s.message();
  const Status missing = ckpt->get_bf16("model.nope.weight", {1}).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.message(), "tensor 'model.nope.weight' not found"));
}

TEST(CheckpointTest, ValidateLayoutFindsMissingUnexpectedWrongShapeAndDtype) {
  const ModelConfig config = tiny_config();
  {
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = layout_tensors(config);
    tensors.erase(tensors.begin() + 5);
    const std::string dropped = layout_tensors(config)[5].name;
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->validate_layout();
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_TRUE(contains(s.message(), "1 tensor(s) missing")) << s.message();
    EXPECT_TRUE(contains(s.message(), dropped)) << s.message();
  }
  {
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = layout_tensors(config);
    tensors.push_back({"model.layers.0.extra.weight", DType::kBF16, {2}, bf16_bytes(2, 1.0f)});
    write_single_file_checkpoint(dir, config, tensors);
    Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
    const Status s = ckpt->validate_layout();
    EXPECT_TRUE(contains(s.message(), "unexpected tensor 'model.layers.0.extra.weight'"))
        << s.message();
    // The model reading only the layout leaves it unused as well.
    for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
      ASSERT_TRUE(ckpt->get_raw(spec.name).ok());
    }
    EXPECT_EQ(ckpt->unused_tensors(), std::vector<std::string>{"model.layers.0.extra.weight"});
    EXPECT_TRUE(contains(ckpt->check_all_used().message(), "model.layers.0.extra.weight"));
  }
  {
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = layout_tensors(config);
    TensorToWrite* t = find(tensors, "model.layers.1.self_attn.kv_b_proj.weight");
    t->shape = {t->shape[1], t->shape[0]};  // transposed
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->validate_layout();
    EXPECT_TRUE(contains(s.message(),
                         "tensor 'model.layers.1.self_attn.kv_b_proj.weight' has "
                         "shape [32, 128], expected [128, 32]"))
        << s.message();
  }
  {
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = layout_tensors(config);
    TensorToWrite* t = find(tensors, "model.norm.weight");
    t->dtype = DType::kI32;
    t->bytes.resize(t->bytes.size() * 2);
    write_single_file_checkpoint(dir, config, tensors);
    Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
    const Status s = ckpt->validate_layout();
    EXPECT_TRUE(contains(s.message(), "tensor 'model.norm.weight' has dtype I32")) << s.message();
    const Status g = ckpt->get_bf16("model.norm.weight", {64}).status();
    EXPECT_EQ(g.code(), StatusCode::kUnimplemented);
    EXPECT_TRUE(contains(g.message(), "has dtype I32, expected a float type")) << g.message();
  }
}

TEST(CheckpointTest, Fp8Errors) {
  ModelConfig config = tiny_config();
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  auto make = [&](const ModelConfig& c, bool with_scale, std::vector<int64_t> scale_shape) {
    std::vector<TensorToWrite> tensors = layout_tensors(c);
    TensorToWrite* t = find(tensors, name);
    t->dtype = DType::kF8E4M3;
    t->bytes.assign(t->bytes.size() / 2, std::byte{0x38});  // 1.0
    if (with_scale) {
      tensors.push_back({fp8_scale_inv_name(name), DType::kF32, scale_shape,
                         std::vector<std::byte>(static_cast<size_t>(numel(scale_shape)) * 4)});
    }
    return tensors;
  };
  {  // no quantization_config
    ScratchDir dir;
    write_single_file_checkpoint(dir, config, make(config, true, {2, 2}));
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "no quantization_config.weight_block_size")) << s.message();
  }
  config.fp8_block_rows = config.fp8_block_cols = 32;
  {  // missing scale
    ScratchDir dir;
    write_single_file_checkpoint(dir, config, make(config, false, {}));
    Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
    const Status s = ckpt->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "'" + name + "_scale_inv' are missing")) << s.message();
    EXPECT_TRUE(contains(ckpt->validate_layout().message(), "_scale_inv' are missing"));
  }
  {  // wrong scale shape
    ScratchDir dir;
    write_single_file_checkpoint(dir, config, make(config, true, {1, 2}));
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "has shape [1, 2], expected [2, 2]")) << s.message();
  }
  {  // a scale that is not finite (a damaged file): refused, naming the block
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = make(config, true, {2, 2});
    TensorToWrite* scale = find(tensors, fp8_scale_inv_name(name));
    const float scales[4] = {0.5f, 1.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
    std::memcpy(scale->bytes.data(), scales, 16);
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "block 2 has scale nan, expected a finite value"))
        << s.message();
  }
  {  // a finite scale whose product with 448 is not: refused, as it would give inf weights
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = make(config, true, {2, 2});
    TensorToWrite* scale = find(tensors, fp8_scale_inv_name(name));
    const float scales[4] = {0.5f, 1.0f, 1.0f, 3e38f};
    std::memcpy(scale->bytes.data(), scales, 16);
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "block 3 has scale")) << s.message();
    EXPECT_TRUE(contains(s.message(), "which times 448 (the largest E4M3 value) is not finite"))
        << s.message();
  }
  {  // a negative scale (it would flip the block's signs, with finite logits): refused
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = make(config, true, {2, 2});
    TensorToWrite* scale = find(tensors, fp8_scale_inv_name(name));
    const float scales[4] = {0.5f, -1.0f, 1.0f, 1.0f};
    std::memcpy(scale->bytes.data(), scales, 16);
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "block 1 has scale -1.000000, expected a finite value >= 0"))
        << s.message();
  }
  {  // an E4M3 NaN code (0x7f, or 0xff with the sign) in the weight: refused, naming where
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = make(config, true, {2, 2});
    TensorToWrite* scale = find(tensors, fp8_scale_inv_name(name));
    const float scales[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    std::memcpy(scale->bytes.data(), scales, 16);
    find(tensors, name)->bytes[5 * 64 + 7] = std::byte{0xff};
    write_single_file_checkpoint(dir, config, tensors);
    const Status s = Checkpoint::open(dir.path())->get_bf16(name, {64, 64}).status();
    EXPECT_TRUE(contains(s.message(), "holds the E4M3 NaN code at [5, 7]")) << s.message();
  }
  {  // correct: scales 0 -> zeros; 1.0 * scale
    ScratchDir dir;
    std::vector<TensorToWrite> tensors = make(config, true, {2, 2});
    TensorToWrite* scale = find(tensors, fp8_scale_inv_name(name));
    const float scales[4] = {0.5f, 2.0f, 1.5f, 0.25f};
    std::memcpy(scale->bytes.data(), scales, 16);
    write_single_file_checkpoint(dir, config, tensors);
    Result<Checkpoint> ckpt = Checkpoint::open(dir.path());
    ASSERT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
    Result<WeightTensor> w = ckpt->get_bf16(name, {64, 64});
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(bf16_to_float(w->bf16_data()[0]), 0.5f);
    EXPECT_EQ(bf16_to_float(w->bf16_data()[40]), 2.0f);
    EXPECT_EQ(bf16_to_float(w->bf16_data()[40 * 64 + 1]), 1.5f);
    EXPECT_EQ(bf16_to_float(w->bf16_data()[63 * 64 + 63]), 0.25f);
    EXPECT_TRUE(ckpt->info(fp8_scale_inv_name(name)).ok());
    const std::vector<std::string> unused = ckpt->unused_tensors();
    EXPECT_EQ(std::count(unused.begin(), unused.end(), fp8_scale_inv_name(name)), 0);
  }
}

// Sharded checkpoints: the index and the shards must agree.
class ShardedIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestModelOptions options;
    ASSERT_TRUE(write_test_model(dir_.path(), options).ok());
    index_ =
        nlohmann::json::parse(testing::read_file_bytes(dir_.file("model.safetensors.index.json")));
  }
  void write_index() {
    testing::write_file_bytes(dir_.file("model.safetensors.index.json"), index_.dump());
  }
  Status open_status() { return Checkpoint::open(dir_.path()).status(); }

  ScratchDir dir_;
  nlohmann::json index_;
};

TEST_F(ShardedIndexTest, TinyHasSeveralShards) {
  std::set<std::string> shards;
  for (const auto& [name, file] : index_["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 3u);
  EXPECT_TRUE(
      shards.contains("model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors"));
  EXPECT_TRUE(open_status().ok());
}

TEST_F(ShardedIndexTest, MissingShardFile) {
  const std::string shard = index_["weight_map"]["model.norm.weight"];
  std::filesystem::remove(dir_.file(shard));
  const Status s = open_status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(s.message(), dir_.file(shard) + ": cannot open")) << s.message();
}

// A FIFO where a file should be: opening it for reading would wait for a writer forever.
TEST_F(ShardedIndexTest, AFifoInPlaceOfAFileIsAnErrorNotAHang) {
  const std::string shard = index_["weight_map"]["model.norm.weight"];
  for (const std::string name : {"config.json", "model.safetensors.index.json", shard.c_str()}) {
    SCOPED_TRACE(name);
    ScratchDir dir;
    std::filesystem::copy(dir_.path(), dir.path(), std::filesystem::copy_options::recursive);
    ASSERT_TRUE(testing::replace_with_fifo(dir.file(name)));
    const Status s = testing::load_beside_fifo(
        dir.file(name), [&] { return Checkpoint::open(dir.path()).status(); });
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_TRUE(contains(s.message(), dir.file(name) + ": ")) << s.message();
    EXPECT_TRUE(contains(s.message(), "regular file")) << s.message();
  }
}

// open() would take the name up to the NUL: another file than the index names.
TEST_F(ShardedIndexTest, AShardNameWithANulByteIsRefused) {
  const std::string shard = index_["weight_map"]["model.norm.weight"];
  for (auto& [name, file] : index_["weight_map"].items()) {
    if (file.get<std::string>() == shard) file = shard + std::string(1, '\0') + ".x";
  }
  write_index();
  const Status s = open_status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "holds a NUL byte, expected a file name")) << s.message();
}

TEST_F(ShardedIndexTest, TensorNotInItsShard) {
  index_["weight_map"]["model.not_there.weight"] = index_["weight_map"]["model.norm.weight"];
  write_index();
  const Status s = open_status();
  EXPECT_TRUE(contains(s.message(), "'model.not_there.weight'")) << s.message();
  EXPECT_TRUE(contains(s.message(), "has no such tensor")) << s.message();
}

TEST_F(ShardedIndexTest, ShardTensorMissingFromIndex) {
  index_["weight_map"].erase("model.norm.weight");
  write_index();
  const Status s = open_status();
  EXPECT_TRUE(contains(s.message(), "tensor 'model.norm.weight' is not listed")) << s.message();
}

TEST_F(ShardedIndexTest, MalformedIndex) {
  testing::write_file_bytes(dir_.file("model.safetensors.index.json"), "{\"weight_map\": [");
  EXPECT_TRUE(contains(open_status().message(), "model.safetensors.index.json: not a valid JSON"));
  index_["weight_map"]["model.norm.weight"] = 7;
  write_index();
  EXPECT_TRUE(contains(open_status().message(), "weight_map['model.norm.weight']"));
  index_["weight_map"]["model.norm.weight"] = "../x.safetensors";
  write_index();
  EXPECT_TRUE(contains(open_status().message(), "expected a file name in the checkpoint"));
}

TEST_F(ShardedIndexTest, TruncatedShardNamesTheFile) {
  const std::string shard =
      dir_.file(index_["weight_map"]["model.layers.1.mlp.gate.weight"].get<std::string>());
  const std::string bytes = testing::read_file_bytes(shard);
  testing::write_file_bytes(shard, bytes.substr(0, bytes.size() - 100));
  const Status s = open_status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(s.message(), shard + ": ")) << s.message();
  EXPECT_TRUE(contains(s.message(), "out of range")) << s.message();
}

TEST_F(ShardedIndexTest, MissingConfigOrWeights) {
  std::filesystem::remove(dir_.file("config.json"));
  EXPECT_TRUE(contains(open_status().message(), "config.json"));
  ScratchDir empty;
  testing::write_file_bytes(empty.file("config.json"), model_config_to_json(tiny_config()));
  const Status s = Checkpoint::open(empty.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(s.message(), "no model.safetensors.index.json or model.safetensors"));
  EXPECT_EQ(Checkpoint::open(empty.file("nope")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace peerserve
