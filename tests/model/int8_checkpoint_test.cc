// Offline INT8 checkpoints (model/int8_checkpoint.h, `peerserve quantize`): every stored
// weight reproduces its source within half a quantization step; the loaded INT8 checkpoint
// gives bitwise the logits of quantizing the source at load; the lm_head choice, FP8 sources,
// and bad INT8 checkpoints (scale missing or misshaped, -128, a negative scale, a misshaped,
// non-F32 or non-finite error compensation, one on gate/up) are refused with errors naming
// the tensor; a stored error compensation is added to its product's output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/deepseek_model.h"
#include "model/int8_checkpoint.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using testing::load_model;
using testing::make_cache;
using testing::make_temp_dir;
using testing::sequence_logits;
using testing::test_tokens;
using testing::tiny_checkpoint_dir;

ModelOptions options(WeightQuantization q, bool lm_head) {
  ModelOptions o;
  o.num_threads = 2;
  o.gemm_precision = GemmPrecision::kBf16;
  o.quantize = q;
  o.quantize_lm_head = lm_head;
  o.load_mtp = true;
  return o;
}

std::string quantized_copy(const std::string& source, const std::string& tag, bool lm_head) {
  const std::string out = make_temp_dir(tag);
  Int8CheckpointOptions o;
  o.lm_head = lm_head;
  o.max_shard_bytes = 64 << 10;  // several shards
  auto summary = write_int8_checkpoint(source, out, o);
  PS_CHECK(summary.ok()) << summary.status().to_string();
  return out;
}

TEST(Int8CheckpointTest, StoredWeightsReproduceTheSource) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8 source" : "bf16 source");
    const std::string out = quantized_copy(tiny_checkpoint_dir(fp8), "int8_values", true);
    auto source = Checkpoint::open(tiny_checkpoint_dir(fp8));
    auto int8 = Checkpoint::open(out);
    ASSERT_TRUE(source.ok() && int8.ok());
    EXPECT_TRUE(int8->config().int8_weights);
    ASSERT_TRUE(int8->validate_layout().ok()) << int8->validate_layout().to_string();
    int64_t quantized = 0;
    for (const TensorSpec& spec : deepseek_tensor_layout(int8->config())) {
      auto info = int8->info(spec.name);
      ASSERT_TRUE(info.ok());
      const bool kv_b = spec.name.find("kv_b_proj") != std::string::npos;
      const bool expect_int8 =
          (spec.role == TensorRole::kLinear && !kv_b) || spec.role == TensorRole::kOutputHead;
      ASSERT_EQ(info->dtype == DType::kI8, expect_int8) << spec.name;
      if (!expect_int8) {
        EXPECT_NE(info->dtype, DType::kF8E4M3) << spec.name;  // kept weights become BF16
        continue;
      }
      ++quantized;
      auto w = source->get_f32(spec.name, spec.shape);
      auto q = int8->get_int8(spec.name, spec.shape);
      ASSERT_TRUE(w.ok() && q.ok()) << spec.name;
      const int64_t rows = spec.shape[0], cols = spec.shape[1];
      for (int64_t r = 0; r < rows; ++r) {
        float absmax = 0.0f;
        for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs((*w)[r * cols + c]));
        const float s = q->scales[r];
        ASSERT_NEAR(s, absmax / 127.0f, absmax * 1e-6f) << spec.name << " row " << r;
        for (int64_t c = 0; c < cols; ++c) {
          const int8_t v = q->values[r * cols + c];
          ASSERT_GE(v, -127);
          // Round to nearest: within half a step (and a float ulp of the product).
          ASSERT_LE(std::fabs(v * s - (*w)[r * cols + c]), 0.5f * s * (1.0f + 1e-5f) + 1e-12f)
              << spec.name << " [" << r << ", " << c << "]";
        }
      }
    }
    EXPECT_GT(quantized, 20);
  }
}

// The INT8 checkpoint loads to the same INT8 weights as quantizing the source at load: the
// same logits, bitwise (the MTP head included).
TEST(Int8CheckpointTest, LoadsLikeLoadTimeQuantization) {
  for (bool lm_head : {true, false}) {
    SCOPED_TRACE(lm_head ? "int8 lm_head" : "bf16 lm_head");
    const std::string out = quantized_copy(tiny_checkpoint_dir(), "int8_logits", lm_head);
    auto offline = load_model(out, options(WeightQuantization::kNone, false));
    auto at_load = load_model(tiny_checkpoint_dir(), options(WeightQuantization::kInt8, lm_head));
    const std::vector<int32_t> tokens = test_tokens(21, offline->config().vocab_size, 5);
    const std::vector<float> a = sequence_logits(*offline, tokens);
    const std::vector<float> b = sequence_logits(*at_load, tokens);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    // And they are INT8 logits, not BF16 ones.
    auto bf16 = load_model(tiny_checkpoint_dir(), options(WeightQuantization::kNone, false));
    const std::vector<float> c = sequence_logits(*bf16, tokens);
    EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
    // lm_head left BF16 is named in the config's "ignore".
    std::ifstream in(fs::path(out) / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in);
    const auto& ignore = config["quantization_config"]["ignore"];
    EXPECT_EQ(std::find(ignore.begin(), ignore.end(), "lm_head") != ignore.end(), !lm_head);
  }
}

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// An error compensation (Int8Transforms::compensation, `--pipeline ...+compensate`) is stored
// as "<weight>_compensation" and added to the product's output rows: on the LM head, every
// logit moves by exactly its row's value; on an attention output and a routed expert's down
// projection, the checkpoint validates, loads (MTP included) and its logits move.
TEST(Int8CheckpointTest, ErrorCompensationIsAddedToTheOutput) {
  const std::string plain_dir = quantized_copy(tiny_checkpoint_dir(), "int8_plain", true);
  auto plain = load_model(plain_dir, options(WeightQuantization::kNone, false));
  const int64_t vocab = plain->config().vocab_size, hidden = plain->config().hidden_size;
  const std::vector<int32_t> tokens = test_tokens(13, vocab, 3);
  const std::vector<float> base = sequence_logits(*plain, tokens);

  auto write_with = [&](const std::map<std::string, std::vector<float>>& compensation) {
    Int8Transforms transforms;
    transforms.compensation = compensation;
    const std::string out = make_temp_dir("int8_compensated");
    Int8CheckpointOptions o;
    o.transforms = &transforms;
    auto summary = write_int8_checkpoint(tiny_checkpoint_dir(), out, o);
    PS_CHECK(summary.ok()) << summary.status().to_string();
    return out;
  };

  // The LM head.
  const std::vector<float> head_c = random_values(vocab, 1);
  const std::string head_dir = write_with({{"lm_head.weight", head_c}});
  {
    auto ckpt = Checkpoint::open(head_dir);
    ASSERT_TRUE(ckpt.ok());
    ASSERT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
    auto q = ckpt->get_int8("lm_head.weight", {vocab, hidden});
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->compensation, head_c);
  }
  auto head_model = load_model(head_dir, options(WeightQuantization::kNone, false));
  const std::vector<float> moved = sequence_logits(*head_model, tokens);
  ASSERT_EQ(moved.size(), base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    // One fp32 addition: within an ulp of the sum.
    ASSERT_NEAR(moved[i] - base[i], head_c[i % vocab], 1e-6f * (std::fabs(base[i]) + 1.0f))
        << "logit " << i % vocab << " of row " << i / vocab;
  }

  // Inside the layers: attention output and a routed expert (with its layer's MoE running).
  const std::string layer_dir =
      write_with({{"model.layers.0.self_attn.o_proj.weight", random_values(hidden, 2)},
                  {"model.layers.1.mlp.experts.3.down_proj.weight", random_values(hidden, 3)}});
  auto ckpt = Checkpoint::open(layer_dir);
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ckpt->validate_layout().ok()) << ckpt->validate_layout().to_string();
  auto layer_model = load_model(layer_dir, options(WeightQuantization::kNone, false));
  const std::vector<float> shifted = sequence_logits(*layer_model, tokens);
  EXPECT_NE(std::memcmp(shifted.data(), base.data(), base.size() * sizeof(float)), 0);

  // A compensation that does not match its weight's rows is refused while writing.
  Int8Transforms bad;
  bad.compensation["lm_head.weight"] = std::vector<float>(3, 1.0f);
  Int8CheckpointOptions o;
  o.transforms = &bad;
  auto refused = write_int8_checkpoint(tiny_checkpoint_dir(), make_temp_dir("int8_bad_comp"), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("lm_head.weight"), std::string::npos);
}

// Rewrites the checkpoint in `dir` as one shard after `edit` changed its tensors.
void rewrite(const std::string& dir,
             const std::function<void(std::map<std::string, TensorToWrite>&)>& edit) {
  std::map<std::string, TensorToWrite> tensors;
  {
    auto ckpt = Checkpoint::open(dir);
    PS_CHECK(ckpt.ok());
    for (const std::string& name : ckpt->tensor_names()) {
      auto t = ckpt->get_raw(name);
      PS_CHECK(t.ok());
      const auto* bytes = static_cast<const std::byte*>(t->data);
      tensors[name] = {name, t->dtype, t->shape, {bytes, bytes + t->nbytes()}};
    }
  }
  edit(tensors);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") fs::remove(entry.path());
  }
  fs::remove(fs::path(dir) / "model.safetensors.index.json");
  std::vector<TensorToWrite> list;
  for (auto& [name, t] : tensors) list.push_back(t);
  PS_CHECK(write_safetensors_file((fs::path(dir) / "model.safetensors").string(), list).ok());
}

TEST(Int8CheckpointTest, BadInt8CheckpointsAreRefusedByName) {
  const std::string weight = "model.layers.1.mlp.experts.3.down_proj.weight";
  struct Case {
    const char* what;
    std::function<void(std::map<std::string, TensorToWrite>&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"scale missing", [&](auto& t) { t.erase(int8_scale_name(weight)); }, "are missing"},
      {"scale misshaped",
       [&](auto& t) {
         TensorToWrite& s = t[int8_scale_name(weight)];
         s.shape = {s.shape[0] / 2, 2};
       },
       "expected ["},
      {"-128 stored", [&](auto& t) { t[weight].bytes[5] = static_cast<std::byte>(0x80); }, "-128"},
      {"negative scale",
       [&](auto& t) {
         const float minus = -1.0f;
         std::memcpy(t[int8_scale_name(weight)].bytes.data(), &minus, 4);
       },
       "expected a finite value >= 0"},
      {"scale whose weights overflow",  // finite, but 127 times it is not: NaN logits unseen
       [&](auto& t) {
         const float huge = 3e38f;
         std::memcpy(t[int8_scale_name(weight)].bytes.data(), &huge, 4);
       },
       "whose product with 127 is finite"},
  };
  // An error compensation: F32 [rows], finite, not on gate/up (it would enter before the
  // fused SiLU).
  auto compensation = [](const std::string& of, DType dtype, std::vector<int64_t> shape,
                         float value) {
    return [=](std::map<std::string, TensorToWrite>& t) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> f(n, value);
      std::vector<std::byte> bytes(n * dtype_size(dtype));
      if (dtype == DType::kF32) std::memcpy(bytes.data(), f.data(), bytes.size());
      t[int8_compensation_name(of)] = {int8_compensation_name(of), dtype, shape, bytes};
    };
  };
  auto source = Checkpoint::open(tiny_checkpoint_dir());
  ASSERT_TRUE(source.ok());
  const int64_t rows = source->info(weight)->shape[0];
  const std::vector<Case> compensation_cases = {
      {"compensation misshaped", compensation(weight, DType::kF32, {rows + 1}, 0.5f),
       "_compensation' has shape ["},
      {"compensation not F32", compensation(weight, DType::kBF16, {rows}, 0.5f), "expected F32"},
      {"compensation not finite", compensation(weight, DType::kF32, {rows}, NAN), "not finite"},
  };
  std::vector<Case> all = cases;
  all.insert(all.end(), compensation_cases.begin(), compensation_cases.end());
  for (const Case& c : all) {
    SCOPED_TRACE(c.what);
    const std::string dir = quantized_copy(tiny_checkpoint_dir(), "int8_bad", true);
    rewrite(dir, c.edit);
    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    auto model = DeepseekModel::load(dir, options(WeightQuantization::kNone, false));
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.status().message().find(c.expected), std::string::npos)
        << model.status().message();
    EXPECT_NE(model.status().message().find("experts.3.down_proj"), std::string::npos)
        << model.status().message();
  }
}

// An I8 weight the model dequantizes (kv_b: the absorbed attention reads BF16 slices) is
// checked like a packed one: -128 is outside symmetric INT8 (it loaded before).
TEST(Int8CheckpointTest, ADequantizedInt8WeightWithMinus128IsRefused) {
  const std::string kv_b = "model.layers.0.self_attn.kv_b_proj.weight";
  const std::string dir = quantized_copy(tiny_checkpoint_dir(), "int8_kv_b", true);
  rewrite(dir, [&](std::map<std::string, TensorToWrite>& t) {
    const std::vector<int64_t> shape = t[kv_b].shape;
    std::vector<std::byte> values(static_cast<size_t>(shape[0] * shape[1]), std::byte{1});
    values[7] = static_cast<std::byte>(0x80);
    t[kv_b] = {kv_b, DType::kI8, shape, values};
    std::vector<float> scales(static_cast<size_t>(shape[0]), 0.01f);
    std::vector<std::byte> scale_bytes(scales.size() * sizeof(float));
    std::memcpy(scale_bytes.data(), scales.data(), scale_bytes.size());
    t[int8_scale_name(kv_b)] = {int8_scale_name(kv_b), DType::kF32, {shape[0], 1}, scale_bytes};
  });
  auto model = DeepseekModel::load(dir, options(WeightQuantization::kNone, false));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("-128"), std::string::npos) << model.status().message();
  EXPECT_NE(model.status().message().find("kv_b_proj"), std::string::npos)
      << model.status().message();
}

TEST(Int8CheckpointTest, ErrorCompensationOnGateOrUpIsRefused) {
  const std::string gate = "model.layers.1.mlp.experts.3.gate_proj.weight";
  const std::string dir = quantized_copy(tiny_checkpoint_dir(), "int8_bad_gate", true);
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  auto info = ckpt->info(gate);
  ASSERT_TRUE(info.ok());
  const int64_t rows = info->shape[0];
  rewrite(dir, [&](std::map<std::string, TensorToWrite>& t) {
    std::vector<std::byte> bytes(rows * 4, std::byte{0});
    t[int8_compensation_name(gate)] = {int8_compensation_name(gate), DType::kF32, {rows}, bytes};
  });
  auto model = DeepseekModel::load(dir, options(WeightQuantization::kNone, false));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("experts.3.gate_proj"), std::string::npos)
      << model.status().message();
  EXPECT_NE(model.status().message().find("not supported"), std::string::npos)
      << model.status().message();
}

TEST(Int8CheckpointTest, MlpsOfMixedPrecisionAreRefusedByName) {
  // Tensors of the BF16 source put back in place of INT8 ones (their scales removed): the
  // MLP kernels run one precision per MLP and per layer's routed experts, so such a file
  // is refused at load, not at its first forward pass.
  auto source = Checkpoint::open(tiny_checkpoint_dir());
  ASSERT_TRUE(source.ok());
  auto restore_bf16 = [&](std::map<std::string, TensorToWrite>& t, const std::string& name) {
    auto raw = source->get_raw(name);
    PS_CHECK(raw.ok()) << name;
    const auto* bytes = static_cast<const std::byte*>(raw->data);
    t[name] = {name, raw->dtype, raw->shape, {bytes, bytes + raw->nbytes()}};
    t.erase(int8_scale_name(name));
  };
  const std::string expert = "model.layers.1.mlp.experts.3.";
  struct Case {
    const char* what;
    std::vector<std::string> restored;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"up only", {expert + "up_proj.weight"}, "up not I8"},
      {"down only", {expert + "down_proj.weight"}, "down not I8"},
      {"one whole expert",
       {expert + "gate_proj.weight", expert + "up_proj.weight", expert + "down_proj.weight"},
       "routed expert 3 is not stored I8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string dir = quantized_copy(tiny_checkpoint_dir(), "int8_mixed", true);
    rewrite(dir, [&](std::map<std::string, TensorToWrite>& t) {
      for (const std::string& name : c.restored) restore_bf16(t, name);
    });
    auto model = DeepseekModel::load(dir, options(WeightQuantization::kNone, false));
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find(c.expected), std::string::npos)
        << model.status().message();
    if (c.restored.size() == 1) {
      EXPECT_NE(model.status().message().find("experts.3."), std::string::npos)
          << model.status().message();
    }
  }
}

TEST(Int8CheckpointTest, RefusesItsSourceAndInt8Sources) {
  auto same = write_int8_checkpoint(tiny_checkpoint_dir(), tiny_checkpoint_dir());
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("is the source"), std::string::npos);
  const std::string out = quantized_copy(tiny_checkpoint_dir(), "int8_twice", true);
  auto twice = write_int8_checkpoint(out, make_temp_dir("int8_twice_out"));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("already an INT8"), std::string::npos);
  // Without its quantization_config the copy still loads (the I8 tensors say what they are);
  // quantizing it again copied them without their scales and wrote a checkpoint that did not.
  {
    std::ifstream in(out + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config.erase("quantization_config");
    std::ofstream(out + "/config.json") << config.dump(2);
  }
  ASSERT_TRUE(DeepseekModel::load(out, options(WeightQuantization::kNone, false)).ok());
  auto unmarked = write_int8_checkpoint(out, make_temp_dir("int8_unmarked_out"));
  ASSERT_FALSE(unmarked.ok());
  EXPECT_NE(unmarked.status().message().find("is already INT8"), std::string::npos)
      << unmarked.status().message();
}

// Nothing is overwritten: a non-empty output directory is refused before any work, and its
// files stay as they were.
TEST(Int8CheckpointTest, ANonEmptyOutputDirectoryIsRefusedAndLeftAlone) {
  const std::string out = make_temp_dir("int8_nonempty");
  {
    std::ofstream keep(fs::path(out) / "keep.txt");
    keep << "mine";
  }
  auto written = write_int8_checkpoint(tiny_checkpoint_dir(), out);
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find("is not empty"), std::string::npos)
      << written.status().message();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(out)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"keep.txt"});
  EXPECT_TRUE(check_int8_output_dir(tiny_checkpoint_dir(), out + "/not-yet").ok());
}

// A write that fails part way (a non-finite weight in the last layer, after earlier shards
// were written) leaves no output directory and no staging directory: nothing that could be
// opened as a checkpoint. It used to leave the shards, the index and the copied files.
TEST(Int8CheckpointTest, AFailedWriteLeavesNoCheckpointBehind) {
  const std::string source = make_temp_dir("int8_nan_source");
  fs::copy(tiny_checkpoint_dir(), source, fs::copy_options::recursive);
  auto ckpt = Checkpoint::open(source);
  ASSERT_TRUE(ckpt.ok());
  const int64_t last = ckpt->config().num_hidden_layers - 1;
  const std::string weight =
      "model.layers." + std::to_string(last) + ".mlp.shared_experts.down_proj.weight";
  ASSERT_TRUE(ckpt->contains(weight));
  rewrite(source, [&](std::map<std::string, TensorToWrite>& t) {
    TensorToWrite& w = t.at(weight);
    ASSERT_EQ(w.dtype, DType::kBF16);
    const uint16_t nan = 0x7fc0;
    std::memcpy(w.bytes.data() + 2 * 7, &nan, 2);
  });
  const fs::path parent = make_temp_dir("int8_failed_out");
  const std::string out = (parent / "int8").string();
  Int8CheckpointOptions o;
  o.max_shard_bytes = 64 << 10;  // shards written before the bad tensor is reached
  auto written = write_int8_checkpoint(source, out, o);
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find("non-finite"), std::string::npos)
      << written.status().message();
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(parent)) << "a staging directory was left in " << parent;
}

// Tensors the output keeps as they were (kv_b, the norms) are checked too: a NaN in kv_b used
// to pass into the INT8 checkpoint, whose activations then hid it as finite values.
TEST(Int8CheckpointTest, ANonFiniteValueInAKeptTensorIsRefusedByName) {
  for (const std::string weight :
       {"model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.input_layernorm.weight"}) {
    const std::string source = make_temp_dir("int8_nan_kept");
    fs::copy(tiny_checkpoint_dir(), source, fs::copy_options::recursive);
    rewrite(source, [&](std::map<std::string, TensorToWrite>& t) {
      TensorToWrite& w = t.at(weight);
      ASSERT_EQ(w.dtype, DType::kBF16);
      const uint16_t nan = 0x7fc0;
      std::memcpy(w.bytes.data() + 2 * 3, &nan, 2);
    });
    auto written = write_int8_checkpoint(source, make_temp_dir("int8_nan_kept_out"));
    ASSERT_FALSE(written.ok()) << weight;
    EXPECT_NE(written.status().message().find("'" + weight + "' has a non-finite value"),
              std::string::npos)
        << written.status().message();
  }
}

}  // namespace
}  // namespace peerserve
