#include "model/int8_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/regular_file.h"
#include "base/staged_output_directory.h"
#include "kernels/int8_matrix.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/tensor_layout.h"
#include "tensor/float_convert.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The index of the first inf or NaN of a float tensor (F32, BF16 or F16), or -1 (also for
// other dtypes, which hold no such values).
int64_t first_non_finite(const WeightTensor& t) {
  const auto* bytes = static_cast<const std::byte*>(t.data);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    float v = 0.0f;
    if (t.dtype == DType::kF32) {
      std::memcpy(&v, bytes + 4 * i, 4);
    } else if (t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      v = t.dtype == DType::kBF16 ? bf16_to_float({bits}) : f16_to_float(bits);
    } else {
      return -1;
    }
    if (!std::isfinite(v)) return i;
  }
  return -1;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A tensor of the output and how it is made.
struct Planned {
  const TensorSpec* spec = nullptr;
  enum class Kind { kQuantize, kCopy, kToBf16, kTransform } kind = Kind::kCopy;
  DType source_dtype = DType::kBF16;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;  // scales included
};

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error(path.string() + ": cannot create");
  out << text;
  out.close();
  if (!out) return io_error(path.string() + ": write failed");
  return ok_status();
}

template <typename T>
std::vector<std::byte> to_bytes(const T* data, size_t count) {
  std::vector<std::byte> bytes(count * sizeof(T));
  if (count > 0) std::memcpy(bytes.data(), data, bytes.size());
  return bytes;
}

// The tensors of one planned entry, read from the source and converted.
// The tensor's values with the calibration transforms applied (columns times s, or a norm
// divided by s).
Result<std::vector<float>> transformed(Checkpoint& source, const TensorSpec& spec,
                                       const Int8Transforms* transforms) {
  PS_ASSIGN_OR_RETURN(std::vector<float> values, source.get_f32(spec.name, spec.shape));
  if (transforms == nullptr) return values;
  if (auto it = transforms->column_scale.find(spec.name); it != transforms->column_scale.end()) {
    const std::vector<float>& s = *it->second;
    const int64_t cols = spec.shape.back();
    if (static_cast<int64_t>(s.size()) != cols) {
      return internal_error(spec.name + ": column scales do not match its columns");
    }
    for (size_t i = 0; i < values.size(); ++i) values[i] *= s[i % cols];
  }
  if (auto it = transforms->norm_divisor.find(spec.name); it != transforms->norm_divisor.end()) {
    const std::vector<float>& s = *it->second;
    if (s.size() != values.size()) return internal_error(spec.name + ": scales do not match");
    for (size_t i = 0; i < values.size(); ++i) values[i] /= s[i];
  }
  return values;
}

Result<std::vector<TensorToWrite>> materialize(Checkpoint& source, const Planned& p,
                                               const Int8Transforms* transforms) {
  const TensorSpec& spec = *p.spec;
  switch (p.kind) {
    case Planned::Kind::kTransform: {
      PS_ASSIGN_OR_RETURN(std::vector<float> values, transformed(source, spec, transforms));
      if (p.source_dtype == DType::kBF16) {
        std::vector<bf16> out(values.size());
        for (size_t i = 0; i < values.size(); ++i) out[i] = float_to_bf16(values[i]);
        return std::vector<TensorToWrite>{
            {spec.name, DType::kBF16, spec.shape, to_bytes(out.data(), out.size())}};
      }
      return std::vector<TensorToWrite>{
          {spec.name, DType::kF32, spec.shape, to_bytes(values.data(), values.size())}};
    }
    case Planned::Kind::kQuantize: {
      PS_ASSIGN_OR_RETURN(std::vector<float> values, transformed(source, spec, transforms));
      const int64_t rows = spec.shape[0], cols = spec.shape[1];
      const std::vector<float>* clip = nullptr;
      if (transforms != nullptr) {
        if (auto it = transforms->row_clip.find(spec.name); it != transforms->row_clip.end()) {
          if (static_cast<int64_t>(it->second.size()) != rows) {
            return internal_error(spec.name + ": clipping ratios do not match its rows");
          }
          clip = &it->second;
        }
      }
      std::vector<int8_t> q(static_cast<size_t>(rows * cols));
      std::vector<float> scales(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          if (!std::isfinite(values[r * cols + c])) {
            return invalid_argument(source.dir() + ": tensor '" + spec.name +
                                    "' has a non-finite value at [" + std::to_string(r) + ", " +
                                    std::to_string(c) + "]");
          }
        }
        const std::span<const float> row(values.data() + r * cols, static_cast<size_t>(cols));
        const std::span<int8_t> row_q(q.data() + r * cols, static_cast<size_t>(cols));
        scales[r] = clip != nullptr ? kernels::quantize_int8_row_clipped(row, (*clip)[r], row_q)
                                    : kernels::quantize_int8_row(row, row_q);
      }
      std::vector<TensorToWrite> out;
      out.push_back({spec.name, DType::kI8, spec.shape, to_bytes(q.data(), q.size())});
      out.push_back({int8_scale_name(spec.name),
                     DType::kF32,
                     {rows, 1},
                     to_bytes(scales.data(), scales.size())});
      if (transforms != nullptr) {
        if (auto it = transforms->compensation.find(spec.name);
            it != transforms->compensation.end()) {
          if (static_cast<int64_t>(it->second.size()) != rows) {
            return internal_error(spec.name + ": the error compensation does not match its rows");
          }
          out.push_back({int8_compensation_name(spec.name),
                         DType::kF32,
                         {rows},
                         to_bytes(it->second.data(), it->second.size())});
        }
      }
      return out;
    }
    case Planned::Kind::kToBf16: {
      PS_ASSIGN_OR_RETURN(WeightTensor t, source.get_bf16(spec.name, spec.shape));
      return std::vector<TensorToWrite>{{spec.name, DType::kBF16, spec.shape,
                                         to_bytes(t.bf16_data(), static_cast<size_t>(t.numel()))}};
    }
    case Planned::Kind::kCopy: {
      PS_ASSIGN_OR_RETURN(WeightTensor t, source.get_raw(spec.name));
      // Copied, not read by the quantizer: a damaged value would pass into the output unseen.
      if (const int64_t bad = first_non_finite(t); bad >= 0) {
        return invalid_argument(source.dir() + ": tensor '" + spec.name +
                                "' has a non-finite value at flat index " + std::to_string(bad));
      }
      const auto* bytes = static_cast<const std::byte*>(t.data);
      return std::vector<TensorToWrite>{
          {spec.name, t.dtype, t.shape, std::vector<std::byte>(bytes, bytes + t.nbytes())}};
    }
  }
  return internal_error("unknown plan");
}

std::string shard_name(size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

}  // namespace

Status check_int8_output_dir(const std::string& in_dir, const std::string& out_dir) {
  if (out_dir.empty()) return invalid_argument("no output directory given");
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::equivalent(in_dir, out_dir, ec)) {
    return invalid_argument("the output directory " + out_dir +
                            " is the source checkpoint; write the INT8 copy elsewhere");
  }
  return check_output_directory(out_dir);
}

Result<Int8CheckpointSummary> write_int8_checkpoint(const std::string& in_dir,
                                                    const std::string& out_dir,
                                                    const Int8CheckpointOptions& options) {
  PS_RETURN_IF_ERROR(check_int8_output_dir(in_dir, out_dir));
  PS_ASSIGN_OR_RETURN(Checkpoint source, Checkpoint::open(in_dir));
  const ModelConfig& config = source.config();
  if (config.int8_weights) {
    return invalid_argument(in_dir + " is already an INT8 checkpoint (quantization_config)");
  }
  PS_RETURN_IF_ERROR(source.validate_layout());
  PS_ASSIGN_OR_RETURN(StagedOutputDirectory staging, StagedOutputDirectory::begin(out_dir));
  std::error_code ec;
  const fs::path out = staging.path();

  // Plan every tensor, then the shards (their names carry the count).
  const std::vector<TensorSpec> layout = deepseek_tensor_layout(config);
  std::vector<Planned> plan;
  std::vector<std::string> ignored_modules;
  Int8CheckpointSummary summary;
  for (const TensorSpec& spec : layout) {
    PS_ASSIGN_OR_RETURN(CheckpointTensorInfo info, source.info(spec.name));
    if (info.dtype == DType::kI8) {
      // INT8 tensors without a quantization_config load, but copying them would leave their
      // scales behind: the source is an INT8 checkpoint either way.
      return invalid_argument(in_dir + ": tensor '" + spec.name +
                              "' is already INT8; quantize a BF16, FP8 or F32 checkpoint");
    }
    Planned p{&spec};
    p.source_dtype = info.dtype;
    const uint64_t n = static_cast<uint64_t>(numel_of(spec.shape));
    p.bytes_in = n * dtype_size(info.dtype);
    const bool linear = spec.role == TensorRole::kLinear || spec.role == TensorRole::kOutputHead;
    const bool quantize =
        (spec.role == TensorRole::kLinear && !ends_with(spec.name, "kv_b_proj.weight")) ||
        (spec.role == TensorRole::kOutputHead && options.lm_head);
    const bool transform =
        options.transforms != nullptr && (options.transforms->column_scale.count(spec.name) > 0 ||
                                          options.transforms->norm_divisor.count(spec.name) > 0);
    if (quantize && !options.quantize_weights) {
      // Testing: the transformed float model.
      p.kind = transform ? Planned::Kind::kTransform : Planned::Kind::kCopy;
      p.bytes_out = p.bytes_in;
      ++summary.kept_tensors;
    } else if (transform && !quantize) {
      p.kind = Planned::Kind::kTransform;
      p.bytes_out = (info.dtype == DType::kBF16 ? 2 : 4) * n;
      ++summary.kept_tensors;
    } else if (quantize) {
      p.kind = Planned::Kind::kQuantize;
      const bool compensated =
          options.transforms != nullptr && options.transforms->compensation.count(spec.name) > 0;
      p.bytes_out = n + (compensated ? 8 : 4) * static_cast<uint64_t>(spec.shape[0]);
      ++summary.quantized_tensors;
    } else {
      p.kind = info.dtype == DType::kF8E4M3 ? Planned::Kind::kToBf16 : Planned::Kind::kCopy;
      p.bytes_out = p.kind == Planned::Kind::kToBf16 ? 2 * n : p.bytes_in;
      ++summary.kept_tensors;
      if (linear)
        ignored_modules.push_back(
            spec.name.substr(0, spec.name.size() - std::string(".weight").size()));
    }
    if (info.dtype == DType::kF8E4M3) {
      PS_ASSIGN_OR_RETURN(CheckpointTensorInfo scale, source.info(fp8_scale_inv_name(spec.name)));
      p.bytes_in += static_cast<uint64_t>(numel_of(scale.shape)) * dtype_size(scale.dtype);
    }
    summary.bytes_in += p.bytes_in;
    summary.bytes_out += p.bytes_out;
    plan.push_back(p);
  }
  std::vector<std::vector<const Planned*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const Planned& p : plan) {
    if (shard_bytes > 0 && shard_bytes + p.bytes_out > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&p);
    shard_bytes += p.bytes_out;
  }

  std::map<std::string, std::string> weight_map;
  uint64_t done = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_name(s, shards.size());
    std::vector<TensorToWrite> tensors;
    for (const Planned* p : shards[s]) {
      PS_ASSIGN_OR_RETURN(std::vector<TensorToWrite> made,
                          materialize(source, *p, options.transforms));
      for (TensorToWrite& t : made) {
        weight_map[t.name] = file;
        tensors.push_back(std::move(t));
      }
      // Read once: its pages need not stay resident (a 31 GB source on a 24 GB machine).
      source.release_pages(p->spec->name);
      if (source.contains(fp8_scale_inv_name(p->spec->name))) {
        source.release_pages(fp8_scale_inv_name(p->spec->name));
      }
      done += p->bytes_in;
      if (options.progress) options.progress(done, summary.bytes_in);
    }
    PS_RETURN_IF_ERROR(write_safetensors_file((out / file).string(), tensors, {{"format", "pt"}}));
  }
  PS_RETURN_IF_ERROR(write_safetensors_index((out / "model.safetensors.index.json").string(),
                                             summary.bytes_out, weight_map));

  // config.json as the source has it, with the INT8 quantization_config.
  PS_ASSIGN_OR_RETURN(std::string config_text,
                      read_regular_file(fs::path(in_dir) / "config.json", kMaxConfigFileBytes));
  json config_json = json::parse(config_text, nullptr, false);
  if (!config_json.is_object()) return invalid_argument(in_dir + "/config.json: not a JSON object");
  if (options.quantize_weights) {
    config_json["quantization_config"] =
        json::parse(int8_quantization_config_json(ignored_modules));
  }
  PS_RETURN_IF_ERROR(write_text(out / "config.json", config_json.dump(2) + "\n"));

  // Everything else (tokenizer, generation config, ...) as is.
  for (const fs::directory_entry& entry : fs::directory_iterator(in_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == "config.json" ||
        name == "model.safetensors.index.json" || ends_with(name, ".safetensors")) {
      continue;
    }
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error(entry.path().string() + ": cannot copy: " + ec.message());
  }
  if (ec) return io_error(in_dir + ": cannot list: " + ec.message());
  PS_RETURN_IF_ERROR(staging.publish());
  return summary;
}

}  // namespace peerserve
