#include "model/checkpoint/test_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "base/staged_output_directory.h"
#include "base/thread_pool.h"
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
constexpr uint64_t kV2LiteShardBytes = 2ull << 30;
// Default values per generation part of a BF16/F32 tensor (larger tensors are cut).
constexpr int64_t kPartValues = int64_t{1} << 20;

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

constexpr int64_t kValueBlock = 4096;

// float_to_bf16 (round to nearest even) for a finite value, without the NaN branch, so that
// the loop vectorizes. The values here are finite: |normal| < 8.6 (uniforms >= 2^-53).
uint16_t finite_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Values [begin, begin + count) of a tensor as F32 (Out = float) or BF16 bits (Out =
// uint16_t) into out[0, count). Each tensor has its own stream (seed, name), so the values
// do not depend on the shard layout or the order of generation, and a part can start
// anywhere in the stream.
template <typename Out>
void generate_values(const TensorSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                     Out* out) {
  DeterministicNormal rng =
      DeterministicNormal::at_normal_index(seed ^ fnv1a64(spec.name), static_cast<uint64_t>(begin));
  double mean = 0.0, std = kWeightStd;
  if (spec.role == TensorRole::kNorm) {
    mean = 1.0;
    std = kNormStd;
  } else if (spec.role == TensorRole::kRouterBias) {
    std = kRouterBiasStd;
  }
  double normals[kValueBlock];
  for (int64_t done = 0; done < count; done += kValueBlock) {
    const int64_t n = std::min(kValueBlock, count - done);
    rng.next_normals({normals, static_cast<size_t>(n)});
    Out* dst = out + done;
    for (int64_t i = 0; i < n; ++i) {
      const float value = static_cast<float>(mean + std * normals[i]);
      if constexpr (std::is_same_v<Out, float>) {
        dst[i] = value;
      } else {
        dst[i] = finite_to_bf16_bits(value);
      }
    }
  }
}

// One tensor's values.
std::vector<float> random_values(const TensorSpec& spec, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(numel_of(spec.shape)));
  generate_values(spec, seed, 0, static_cast<int64_t>(values.size()), values.data());
  return values;
}

// What gets stored for one spec: the tensor and, for FP8, its scales.
struct StoredTensor {
  const TensorSpec* spec = nullptr;
  bool fp8 = false;
  uint64_t bytes = 0;  // total, scales included
};

Fp8BlockShape fp8_shape(const TensorSpec& spec, const ModelConfig& config) {
  return {spec.shape[0], spec.shape[1], *config.fp8_block_rows, *config.fp8_block_cols};
}

// One tensor of a shard file: where its bytes go.
struct ShardTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in the data section
  uint64_t size = 0;
};

// The stored tensors of one spec (the weight and, for FP8, its scales), without offsets.
std::vector<ShardTensor> shard_tensors_of(const StoredTensor& stored, const ModelConfig& config) {
  const TensorSpec& spec = *stored.spec;
  const uint64_t n = static_cast<uint64_t>(numel_of(spec.shape));
  if (stored.fp8) {
    const Fp8BlockShape shape = fp8_shape(spec, config);
    const std::vector<int64_t> scale_shape = {shape.scale_rows(), shape.scale_cols()};
    return {{spec.name, DType::kF8E4M3, spec.shape, 0, n},
            {fp8_scale_inv_name(spec.name), DType::kF32, scale_shape, 0,
             4 * static_cast<uint64_t>(numel_of(scale_shape))}};
  }
  if (spec.role == TensorRole::kRouterBias) {  // F32 in DeepSeek-V3 checkpoints
    return {{spec.name, DType::kF32, spec.shape, 0, 4 * n}};
  }
  return {{spec.name, DType::kBF16, spec.shape, 0, 2 * n}};
}

// Exactly the header write_safetensors_file writes (safetensors_header_bytes: keys sorted,
// padded with spaces to 8 bytes, 8-byte little-endian length first), from the sizes alone.
std::string shard_header(const std::vector<ShardTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  for (const ShardTensor& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {t.offset, t.offset + t.size}}};
  }
  header["__metadata__"] = std::map<std::string, std::string>{{"format", "pt"}};
  return frame_safetensors_header(header.dump());
}

// Writes all of `bytes` at `offset`.
Status pwrite_all(int fd, const void* bytes, size_t size, uint64_t offset,
                  const std::string& path) {
  const char* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error(path + ": write failed: " + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return ok_status();
}

// Part of one shard: values [begin, end) of a BF16/F32 tensor, or a whole FP8 tensor
// (quantized in blocks that span many rows) with its scales.
struct GenerationJob {
  size_t stored = 0;  // index into the shard's stored tensors
  int64_t begin = 0, end = 0;
};

// Writes one shard file: the header, then the tensors' bytes, generated by the threads of
// `pool` in parts and written at their offsets as they are done, so that only the parts in
// flight are in memory. Appends the shard's tensor names to `names`.
Status write_shard(const std::string& path, const std::vector<StoredTensor>& stored,
                   const ModelConfig& config, uint64_t seed, int64_t part_values, ThreadPool& pool,
                   const std::function<void(uint64_t)>& on_bytes, std::vector<std::string>& names) {
  std::vector<ShardTensor> tensors;
  std::vector<size_t> first_tensor(stored.size());
  std::vector<GenerationJob> jobs;
  uint64_t offset = 0;
  for (size_t i = 0; i < stored.size(); ++i) {
    first_tensor[i] = tensors.size();
    for (ShardTensor& t : shard_tensors_of(stored[i], config)) {
      t.offset = offset;
      offset += t.size;
      names.push_back(t.name);
      tensors.push_back(std::move(t));
    }
    const int64_t n = numel_of(stored[i].spec->shape);
    const int64_t step = stored[i].fp8 ? n : part_values;
    for (int64_t begin = 0; begin < n; begin += step) {
      jobs.push_back({i, begin, std::min(n, begin + step)});
    }
  }
  const std::string header = shard_header(tensors);
  const uint64_t data_start = header.size();

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return io_error(path + ": cannot create: " + std::strerror(errno));
  Status status = pwrite_all(fd, header.data(), header.size(), 0, path);
  std::mutex status_mutex;
  std::atomic<bool> failed{!status.ok()};
  std::atomic<size_t> next{0};
  pool.run_on_all([&](int, int) {
    std::vector<float> floats;
    std::vector<uint16_t> narrow;
    for (size_t j = next++; j < jobs.size() && !failed; j = next++) {
      const GenerationJob& job = jobs[j];
      const StoredTensor& st = stored[job.stored];
      const TensorSpec& spec = *st.spec;
      const ShardTensor& out = tensors[first_tensor[job.stored]];
      Status written;
      uint64_t bytes = st.bytes;  // FP8: the weight and its scales
      if (st.fp8) {
        const Fp8BlockQuantized q =
            quantize_fp8_blocks(fp8_shape(spec, config), random_values(spec, seed));
        const ShardTensor& scales = tensors[first_tensor[job.stored] + 1];
        written = pwrite_all(fd, q.weight.data(), out.size, data_start + out.offset, path);
        if (written.ok()) {
          written =
              pwrite_all(fd, q.scale_inv.data(), scales.size, data_start + scales.offset, path);
        }
      } else {
        const int64_t n = job.end - job.begin;
        const void* data = nullptr;
        const size_t width = dtype_size(out.dtype);  // F32 (router bias) or BF16
        if (width == 4) {
          floats.resize(static_cast<size_t>(n));
          generate_values(spec, seed, job.begin, n, floats.data());
          data = floats.data();
        } else {
          narrow.resize(static_cast<size_t>(n));
          generate_values(spec, seed, job.begin, n, narrow.data());
          data = narrow.data();
        }
        bytes = static_cast<uint64_t>(n) * width;
        written =
            pwrite_all(fd, data, bytes,
                       data_start + out.offset + static_cast<uint64_t>(job.begin) * width, path);
      }
      if (!written.ok()) {
        std::lock_guard lock(status_mutex);
        if (status.ok()) status = written;
        failed = true;
        return;
      }
      on_bytes(bytes);
    }
  });
  if (::close(fd) != 0 && status.ok()) {
    status = io_error(path + ": write failed: " + std::strerror(errno));
  }
  return status;
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
  g["eos_token_id"] = config.eos_token_ids.empty() ? 1 : config.eos_token_ids[0];
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
  if (name == "v2-lite") return TestModelPreset::kV2Lite;
  return invalid_argument("unknown test model preset '" + std::string(name) +
                          "', expected tiny, mini, tiny-v2 or v2-lite");
}

std::string_view test_model_preset_name(TestModelPreset preset) {
  switch (preset) {
    case TestModelPreset::kTiny:
      return "tiny";
    case TestModelPreset::kMini:
      return "mini";
    case TestModelPreset::kTinyV2:
      return "tiny-v2";
    case TestModelPreset::kV2Lite:
      return "v2-lite";
  }
  return "unknown";
}

ModelConfig test_model_config(TestModelPreset preset, bool fp8) {
  if (preset == TestModelPreset::kV2Lite) {
    // DeepSeek-V2-Lite's config.json (deepseek-ai/DeepSeek-V2-Lite), except bos/eos, which
    // are the test tokenizer's (V2-Lite's own are 100000/100001).
    ModelConfig c;
    c.arch = ModelArch::kDeepseekV2;
    c.vocab_size = 102400;
    c.hidden_size = 2048;
    c.intermediate_size = 10944;
    c.moe_intermediate_size = 1408;
    c.num_hidden_layers = 27;
    c.num_nextn_predict_layers = 0;
    c.num_attention_heads = 16;
    c.n_shared_experts = 2;
    c.n_routed_experts = 64;
    c.routed_scaling_factor = 1.0;
    c.n_group = 1;
    c.topk_group = 1;
    c.num_experts_per_tok = 6;
    c.moe_layer_freq = 1;
    c.first_k_dense_replace = 1;
    c.norm_topk_prob = false;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.topk_method = TopkMethod::kGreedy;
    c.q_lora_rank.reset();  // q_proj
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.max_position_embeddings = 163840;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.rope_scaling = YarnScaling{.factor = 40.0,
                                 .original_max_position_embeddings = 4096,
                                 .beta_fast = 32.0,
                                 .beta_slow = 1.0,
                                 .mscale = 0.707,
                                 .mscale_all_dim = 0.707};
    c.tie_word_embeddings = false;
    c.bos_token_id = 0;
    c.eos_token_ids = {1};
    if (fp8) c.fp8_block_rows = c.fp8_block_cols = 128;
    return c;
  }
  ModelConfig c;  // DeepSeek-V3 defaults: sigmoid scoring, noaux_tc, norm_topk_prob, 2.5 scale
  c.arch = ModelArch::kDeepseekV3;
  c.vocab_size = test_tokenizer_vocab_size();
  c.num_nextn_predict_layers = 1;
  c.n_shared_experts = 1;
  c.first_k_dense_replace = 1;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
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

Result<ModelConfig> test_model_config(const TestModelOptions& options) {
  ModelConfig config = test_model_config(options.preset, options.fp8);
  if (options.num_layers) {
    // 1024: the most the loader takes (model_config.cc).
    if (*options.num_layers < 1 || *options.num_layers > 1024) {
      return invalid_argument("num_layers must be at least 1 and at most 1024, got " +
                              std::to_string(*options.num_layers));
    }
    config.num_hidden_layers = *options.num_layers;
  }
  return config;
}

Status write_test_model(const std::string& out_dir, const TestModelOptions& options) {
  PS_ASSIGN_OR_RETURN(const ModelConfig config, test_model_config(options));
  PS_ASSIGN_OR_RETURN(StagedOutputDirectory staging, StagedOutputDirectory::begin(out_dir));
  const fs::path dir = staging.path();

  PS_RETURN_IF_ERROR(write_text(dir / "config.json", model_config_to_json(config)));
  PS_RETURN_IF_ERROR(write_text(dir / "generation_config.json", generation_config_json(config)));
  PS_RETURN_IF_ERROR(write_text(dir / "tokenizer.json", test_tokenizer_json()));
  PS_RETURN_IF_ERROR(write_text(dir / "tokenizer_config.json", test_tokenizer_config_json()));

  // Plan the shards from the sizes first (file names carry the shard count), then write one
  // shard after another, each generated in parallel parts.
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(config);
  uint64_t max_shard = options.max_shard_bytes;
  if (max_shard == 0) {
    max_shard = options.preset == TestModelPreset::kMini     ? kMiniShardBytes
                : options.preset == TestModelPreset::kV2Lite ? kV2LiteShardBytes
                                                             : kTinyShardBytes;
  }
  std::vector<std::vector<StoredTensor>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorSpec& spec : layout) {
    StoredTensor stored{&spec, options.fp8 && is_fp8_quantizable(spec.role), 0};
    const uint64_t n = static_cast<uint64_t>(numel_of(spec.shape));
    if (stored.fp8) {
      const Fp8BlockShape shape = fp8_shape(spec, config);
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

  if (options.part_values < 0) return invalid_argument("part_values must be >= 0");
  const int64_t part_values = options.part_values > 0 ? options.part_values : kPartValues;
  ThreadPool pool(options.num_threads);
  std::mutex progress_mutex;
  uint64_t generated = 0;
  const auto on_bytes = [&](uint64_t bytes) {
    std::lock_guard lock(progress_mutex);
    generated += bytes;
    if (options.progress) options.progress(generated, total_bytes);
  };
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_name(s, shards.size());
    std::vector<std::string> names;
    PS_RETURN_IF_ERROR(write_shard((dir / file).string(), shards[s], config, options.seed,
                                   part_values, pool, on_bytes, names));
    for (std::string& name : names) weight_map[std::move(name)] = file;
  }
  PS_RETURN_IF_ERROR(write_safetensors_index((dir / "model.safetensors.index.json").string(),
                                             total_bytes, weight_map));
  return staging.publish();
}

}  // namespace peerserve
