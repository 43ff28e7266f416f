#include "model/checkpoint/test_model.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/checkpoint/deterministic_normal.h"
#include "model/checkpoint/fp8_block_scaling.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/checkpoint/test_tokenizer.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kTinyShardBytes = 256ull << 10;
constexpr uint64_t kMiniShardBytes = 256ull << 20;

// Initialisation scales: projections like a trained model's (std 0.02), norm weights near 1,
// and a correction bias large enough to change which experts win.
constexpr double kWeightStd = 0.02;
constexpr double kNormStd = 0.02;
constexpr double kRouterBiasStd = 0.05;

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One tensor's values; each tensor has its own stream (seed, name), so the values do not
// depend on the shard layout or the order of generation.
std::vector<float> random_values(const TensorSpec& spec, uint64_t seed) {
  DeterministicNormal rng(seed ^ fnv1a64(spec.name));
  std::vector<float> values(static_cast<size_t>(numel_of(spec.shape)));
  double mean = 0.0, std = kWeightStd;
  if (spec.role == TensorRole::kNorm) {
    mean = 1.0;
    std = kNormStd;
  } else if (spec.role == TensorRole::kRouterBias) {
    std = kRouterBiasStd;
  }
  for (float& v : values) v = static_cast<float>(mean + std * rng.next_normal());
  return values;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// What gets stored for one spec: the tensor and, for FP8, its scales.
struct StoredTensor {
  const TensorSpec* spec = nullptr;
  bool fp8 = false;
  uint64_t bytes = 0;  // total, scales included
};

std::vector<TensorToWrite> materialize(const StoredTensor& stored, const ModelConfig& config,
                                       uint64_t seed) {
  const TensorSpec& spec = *stored.spec;
  const std::vector<float> values = random_values(spec, seed);
  if (stored.fp8) {
    const Fp8BlockShape shape{spec.shape[0], spec.shape[1], *config.fp8_block_rows,
                              *config.fp8_block_cols};
    Fp8BlockQuantized q = quantize_fp8_blocks(shape, values);
    return {{spec.name, DType::kF8E4M3, spec.shape, as_bytes(q.weight)},
            {fp8_scale_inv_name(spec.name),
             DType::kF32,
             {shape.scale_rows(), shape.scale_cols()},
             as_bytes(q.scale_inv)}};
  }
  if (spec.role == TensorRole::kRouterBias) {  // F32 in DeepSeek-V3 checkpoints
    return {{spec.name, DType::kF32, spec.shape, as_bytes(values)}};
  }
  std::vector<bf16> narrow(values.size());
  for (size_t i = 0; i < values.size(); ++i) narrow[i] = float_to_bf16(values[i]);
  return {{spec.name, DType::kBF16, spec.shape, as_bytes(narrow)}};
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error(path.string() + ": cannot create");
  out << text;
  out.close();
  if (!out) return io_error(path.string() + ": write failed");
  return ok_status();
}

std::string generation_config_json(const ModelConfig& config) {
  nlohmann::ordered_json g;
  g["_from_model_config"] = true;
  g["bos_token_id"] = config.bos_token_id.value_or(0);
  g["eos_token_id"] = config.eos_token_id.value_or(1);
  g["do_sample"] = true;
  g["temperature"] = 0.6;
  g["top_p"] = 0.95;
  g["transformers_version"] = "4.46.3";
  return g.dump(2) + "\n";
}

std::string shard_name(size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

}  // namespace

Result<TestModelPreset> parse_test_model_preset(std::string_view name) {
  if (name == "tiny") return TestModelPreset::kTiny;
  if (name == "mini") return TestModelPreset::kMini;
  if (name == "tiny-v2") return TestModelPreset::kTinyV2;
  return invalid_argument("unknown test model preset '" + std::string(name) +
                          "', expected tiny, mini or tiny-v2");
}

std::string_view test_model_preset_name(TestModelPreset preset) {
  switch (preset) {
    case TestModelPreset::kTiny:
      return "tiny";
    case TestModelPreset::kMini:
      return "mini";
    case TestModelPreset::kTinyV2:
      return "tiny-v2";
  }
  return "unknown";
}

ModelConfig test_model_config(TestModelPreset preset, bool fp8) {
  ModelConfig c;  // DeepSeek-V3 defaults: sigmoid scoring, noaux_tc, norm_topk_prob, 2.5 scale
  c.arch = ModelArch::kDeepseekV3;
  c.vocab_size = test_tokenizer_vocab_size();
  c.num_nextn_predict_layers = 1;
  c.n_shared_experts = 1;
  c.first_k_dense_replace = 1;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  if (preset == TestModelPreset::kTiny || preset == TestModelPreset::kTinyV2) {
    // Sizes deliberately not multiples of 32 (intermediate 80, q_lora_rank 48, kv_a rows 40)
    // so that the FP8 variant has partial edge blocks.
    c.hidden_size = 64;
    c.intermediate_size = 80;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.n_routed_experts = 8;
    c.n_group = 4;
    c.topk_group = 2;
    c.num_experts_per_tok = 2;
    c.q_lora_rank = 48;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.max_position_embeddings = 4096;
    c.rope_scaling = YarnScaling{.factor = 4.0,
                                 .original_max_position_embeddings = 1024,
                                 .beta_fast = 32.0,
                                 .beta_slow = 1.0,
                                 .mscale = 1.0,
                                 .mscale_all_dim = 1.0};
    if (fp8) c.fp8_block_rows = c.fp8_block_cols = 32;
  } else {
    c.hidden_size = 1024;
    c.intermediate_size = 2816;
    c.moe_intermediate_size = 512;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 16;
    c.n_routed_experts = 64;
    c.n_group = 8;
    c.topk_group = 4;
    c.num_experts_per_tok = 6;
    c.q_lora_rank = 384;
    c.kv_lora_rank = 256;
    c.qk_nope_head_dim = 64;
    c.qk_rope_head_dim = 32;
    c.v_head_dim = 64;
    c.max_position_embeddings = 16384;
    c.rope_scaling = YarnScaling{.factor = 4.0,
                                 .original_max_position_embeddings = 4096,
                                 .beta_fast = 32.0,
                                 .beta_slow = 1.0,
                                 .mscale = 1.0,
                                 .mscale_all_dim = 1.0};
    if (fp8) c.fp8_block_rows = c.fp8_block_cols = 128;
  }
  if (preset == TestModelPreset::kTinyV2) {
    // DeepSeek-V2's differences (as V2-Lite's config.json has them).
    c.arch = ModelArch::kDeepseekV2;
    c.q_lora_rank.reset();
    c.scoring_func = ScoringFunc::kSoftmax;
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 16.0;
    c.num_nextn_predict_layers = 0;
    c.n_shared_experts = 2;
    c.rope_scaling->mscale = 0.707;
    c.rope_scaling->mscale_all_dim = 0.707;
  }
  return c;
}

Status write_test_model(const std::string& out_dir, const TestModelOptions& options) {
  const ModelConfig config = test_model_config(options.preset, options.fp8);
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(out_dir + ": cannot create directory: " + ec.message());

  PS_RETURN_IF_ERROR(write_text(dir / "config.json", model_config_to_json(config)));
  PS_RETURN_IF_ERROR(write_text(dir / "generation_config.json", generation_config_json(config)));
  PS_RETURN_IF_ERROR(write_text(dir / "tokenizer.json", test_tokenizer_json()));
  PS_RETURN_IF_ERROR(write_text(dir / "tokenizer_config.json", test_tokenizer_config_json()));

  // Plan the shards from the sizes first (file names carry the shard count), then generate
  // and write one shard at a time so that memory stays at one shard.
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(config);
  const uint64_t max_shard = options.max_shard_bytes != 0               ? options.max_shard_bytes
                             : options.preset == TestModelPreset::kMini ? kMiniShardBytes
                                                                        : kTinyShardBytes;
  std::vector<std::vector<StoredTensor>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorSpec& spec : layout) {
    StoredTensor stored{&spec, options.fp8 && is_fp8_quantizable(spec.role), 0};
    const uint64_t n = static_cast<uint64_t>(numel_of(spec.shape));
    if (stored.fp8) {
      const Fp8BlockShape shape{spec.shape[0], spec.shape[1], *config.fp8_block_rows,
                                *config.fp8_block_cols};
      stored.bytes = n + 4 * static_cast<uint64_t>(shape.scale_rows() * shape.scale_cols());
    } else {
      stored.bytes = n * (spec.role == TensorRole::kRouterBias ? 4 : 2);
    }
    if (shard_bytes > 0 && shard_bytes + stored.bytes > max_shard) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(stored);
    shard_bytes += stored.bytes;
    total_bytes += stored.bytes;
  }

  std::map<std::string, std::string> weight_map;
  uint64_t written = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_name(s, shards.size());
    std::vector<TensorToWrite> tensors;
    for (const StoredTensor& stored : shards[s]) {
      for (TensorToWrite& t : materialize(stored, config, options.seed)) {
        weight_map[t.name] = file;
        tensors.push_back(std::move(t));
      }
      written += stored.bytes;
      if (options.progress) options.progress(written, total_bytes);
    }
    PS_RETURN_IF_ERROR(write_safetensors_file((dir / file).string(), tensors, {{"format", "pt"}}));
  }
  return write_safetensors_index((dir / "model.safetensors.index.json").string(), total_bytes,
                                 weight_map);
}

}  // namespace peerserve
