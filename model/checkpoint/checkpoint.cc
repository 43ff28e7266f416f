#include "model/checkpoint/checkpoint.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/json_nesting.h"
#include "base/regular_file.h"
#include "model/checkpoint/fp8_block_scaling.h"
#include "model/checkpoint/safetensors.h"
#include "model/checkpoint/tensor_layout.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
// An index is two levels deep (metadata, weight_map).
constexpr size_t kMaxIndexJsonDepth = 16;
constexpr const char* kSingleFile = "model.safetensors";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// DeepSeek-V3's index is ~9 MB.
constexpr uint64_t kMaxIndexFileBytes = 256ull << 20;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Reads `count` elements of a possibly unaligned little-endian array as T.
template <typename T>
std::vector<T> copy_elements(std::span<const std::byte> bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

struct TensorEntry {
  std::string name;
  size_t shard = 0;
  const SafetensorsTensorInfo* info = nullptr;  // points into shards[shard].header()
};

}  // namespace

int64_t WeightTensor::numel() const {
  return numel_of(shape);
}

size_t WeightTensor::nbytes() const {
  return static_cast<size_t>(numel()) * dtype_size(dtype);
}

const bf16* WeightTensor::bf16_data() const {
  PS_CHECK(dtype == DType::kBF16) << "tensor dtype is " << dtype_name(dtype);
  return static_cast<const bf16*>(data);
}

struct Checkpoint::Impl {
  std::string dir;
  ModelConfig config;
  CheckpointOptions options;
  std::vector<SafetensorsFile> shards;
  std::vector<TensorEntry> entries;                  // sorted by name
  std::map<std::string, size_t, std::less<>> index;  // name -> entries position
  uint64_t total_bytes = 0;
  std::atomic<uint64_t> bytes_done{0};

  std::mutex used_mutex;
  std::vector<bool> used;  // by entries position; guarded by used_mutex

  // get_bf16's converted copies while someone holds them: asked again, a tensor gives the
  // same memory, so its data pointer identifies it as a zero-copy view does (calibration
  // matches the model's weights by it). Weak: costs no memory once the holders are gone.
  std::mutex converted_mutex;
  std::map<const TensorEntry*, std::weak_ptr<std::vector<bf16>>> converted;

  const TensorEntry* find(std::string_view name) const {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &entries[it->second];
  }
  const std::string& file_of(const TensorEntry& e) const { return shards[e.shard].path(); }
  std::span<const std::byte> bytes_of(const TensorEntry& e) const {
    return shards[e.shard].tensor_bytes(*e.info);
  }

  Result<const TensorEntry*> lookup(std::string_view name) const {
    const TensorEntry* e = find(name);
    if (e == nullptr) {
      return not_found(dir + ": tensor '" + std::string(name) + "' not found in the checkpoint");
    }
    return e;
  }

  Status check_shape(const TensorEntry& e, const std::vector<int64_t>& expected) const {
    if (e.info->shape == expected) return ok_status();
    return invalid_argument(file_of(e) + ": tensor '" + e.name + "' has shape " +
                            shape_string(e.info->shape) + ", expected " + shape_string(expected));
  }

  void mark_used(const TensorEntry& e) {
    const size_t position = index.find(e.name)->second;
    bool newly_used = false;
    {
      std::lock_guard<std::mutex> lock(used_mutex);
      newly_used = !used[position];
      used[position] = true;
    }
    if (newly_used && options.progress) {
      const uint64_t size = e.info->end - e.info->begin;
      options.progress(bytes_done.fetch_add(size) + size, total_bytes);
    }
  }

  // The block scales of an FP8 weight, validated against the config and the weight's shape.
  Result<std::vector<float>> fp8_scales(const TensorEntry& weight, Fp8BlockShape& shape) const {
    const std::string where = file_of(weight) + ": tensor '" + weight.name + "'";
    if (!config.fp8_block_rows || !config.fp8_block_cols) {
      return invalid_argument(where +
                              " is F8_E4M3, but config.json has no "
                              "quantization_config.weight_block_size");
    }
    if (weight.info->shape.size() != 2) {
      return invalid_argument(where + " is F8_E4M3 with shape " + shape_string(weight.info->shape) +
                              ", expected a 2-D matrix");
    }
    shape = {weight.info->shape[0], weight.info->shape[1], *config.fp8_block_rows,
             *config.fp8_block_cols};
    const std::string scale_name = fp8_scale_inv_name(weight.name);
    const TensorEntry* scale = find(scale_name);
    if (scale == nullptr) {
      return not_found(where + " is F8_E4M3, but its block scales '" + scale_name +
                       "' are missing");
    }
    const std::vector<int64_t> expected = {shape.scale_rows(), shape.scale_cols()};
    if (scale->info->shape != expected) {
      return invalid_argument(
          file_of(*scale) + ": tensor '" + scale_name + "' has shape " +
          shape_string(scale->info->shape) + ", expected " + shape_string(expected) + " (weight " +
          shape_string(weight.info->shape) + " in blocks of " + std::to_string(shape.block_rows) +
          "x" + std::to_string(shape.block_cols) + ")");
    }
    const std::span<const std::byte> bytes = bytes_of(*scale);
    std::vector<float> out;
    switch (scale->info->dtype) {
      case DType::kF32:
        out = copy_elements<float>(bytes);
        break;
      case DType::kBF16:
        for (uint16_t bits : copy_elements<uint16_t>(bytes)) out.push_back(bf16_to_float({bits}));
        break;
      default:
        return invalid_argument(file_of(*scale) + ": tensor '" + scale_name + "' has dtype " +
                                std::string(dtype_name(scale->info->dtype)) +
                                ", expected F32 (or BF16) block scales");
    }
    // A damaged scale would turn a whole block into NaN or infinite logits, or flip its signs,
    // unseen: it must be >= 0 and its product with E4M3's largest magnitude (448) finite.
    for (size_t b = 0; b < out.size(); ++b) {
      if (!std::isfinite(out[b] * 448.0f) || out[b] < 0.0f) {
        return invalid_argument(file_of(*scale) + ": tensor '" + scale_name + "' block " +
                                std::to_string(b) + " has scale " + std::to_string(out[b]) +
                                (!std::isfinite(out[b]) || out[b] < 0.0f
                                     ? ", expected a finite value >= 0"
                                     : ", which times 448 (the largest E4M3 value) is not finite"));
      }
    }
    return out;
  }

  // The per-row scales of an I8 weight ("<name>_scale", [rows, 1] or [rows]).
  Result<std::vector<float>> int8_scales(const TensorEntry& weight) const {
    const std::string where = file_of(weight) + ": tensor '" + weight.name + "'";
    if (weight.info->shape.size() != 2) {
      return invalid_argument(where + " is I8 with shape " + shape_string(weight.info->shape) +
                              ", expected a 2-D matrix");
    }
    const int64_t rows = weight.info->shape[0];
    const std::string scale_name = int8_scale_name(weight.name);
    const TensorEntry* scale = find(scale_name);
    if (scale == nullptr) {
      return not_found(where + " is I8, but its per-row scales '" + scale_name + "' are missing");
    }
    const std::vector<int64_t>& shape = scale->info->shape;
    if (!(shape == std::vector<int64_t>{rows, 1} || shape == std::vector<int64_t>{rows})) {
      return invalid_argument(file_of(*scale) + ": tensor '" + scale_name + "' has shape " +
                              shape_string(shape) + ", expected [" + std::to_string(rows) +
                              ", 1] (one scale per row of " + shape_string(weight.info->shape) +
                              ")");
    }
    const std::span<const std::byte> bytes = bytes_of(*scale);
    std::vector<float> out;
    switch (scale->info->dtype) {
      case DType::kF32:
        out = copy_elements<float>(bytes);
        break;
      case DType::kBF16:
        for (uint16_t bits : copy_elements<uint16_t>(bytes)) out.push_back(bf16_to_float({bits}));
        break;
      case DType::kF16:
        for (uint16_t bits : copy_elements<uint16_t>(bytes)) out.push_back(f16_to_float(bits));
        break;
      default:
        return invalid_argument(file_of(*scale) + ": tensor '" + scale_name + "' has dtype " +
                                std::string(dtype_name(scale->info->dtype)) +
                                ", expected F32, BF16 or F16 scales");
    }
    // The dequantized weights (up to 127 times the scale) must be finite too.
    for (size_t r = 0; r < out.size(); ++r) {
      if (!std::isfinite(out[r] * 127.0f) || out[r] < 0.0f) {
        return invalid_argument(file_of(*scale) + ": tensor '" + scale_name + "' row " +
                                std::to_string(r) + " has scale " + std::to_string(out[r]) +
                                ", expected a finite value >= 0 whose product with 127 is finite");
      }
    }
    return out;
  }
  // The error compensation of an I8 weight ("<name>_compensation", F32 [rows] or [rows, 1]),
  // or an empty vector when it has none.
  Result<std::vector<float>> int8_compensation(const TensorEntry& weight) const {
    const std::string name = int8_compensation_name(weight.name);
    const TensorEntry* c = find(name);
    if (c == nullptr) return std::vector<float>{};
    const int64_t rows = weight.info->shape.empty() ? 0 : weight.info->shape[0];
    const std::vector<int64_t>& shape = c->info->shape;
    if (!(shape == std::vector<int64_t>{rows} || shape == std::vector<int64_t>{rows, 1})) {
      return invalid_argument(file_of(*c) + ": tensor '" + name + "' has shape " +
                              shape_string(shape) + ", expected [" + std::to_string(rows) +
                              "] (one value per row of " + shape_string(weight.info->shape) + ")");
    }
    if (c->info->dtype != DType::kF32) {
      return invalid_argument(file_of(*c) + ": tensor '" + name + "' has dtype " +
                              std::string(dtype_name(c->info->dtype)) + ", expected F32");
    }
    std::vector<float> out = copy_elements<float>(bytes_of(*c));
    for (size_t r = 0; r < out.size(); ++r) {
      if (!std::isfinite(out[r])) {
        return invalid_argument(file_of(*c) + ": tensor '" + name + "' row " + std::to_string(r) +
                                " is not finite");
      }
    }
    return out;
  }

  // Converts any float dtype to BF16 into owned memory.
  Result<std::shared_ptr<std::vector<bf16>>> convert_to_bf16(const TensorEntry& e) {
    const std::span<const std::byte> bytes = bytes_of(e);
    auto out = std::make_shared<std::vector<bf16>>(static_cast<size_t>(e.info->numel()));
    switch (e.info->dtype) {
      case DType::kBF16: {
        std::memcpy(out->data(), bytes.data(), bytes.size());
        break;
      }
      case DType::kF32: {
        const std::vector<float> values = copy_elements<float>(bytes);
        for (size_t i = 0; i < values.size(); ++i) (*out)[i] = float_to_bf16(values[i]);
        break;
      }
      case DType::kF16: {
        const std::vector<uint16_t> values = copy_elements<uint16_t>(bytes);
        for (size_t i = 0; i < values.size(); ++i) {
          (*out)[i] = float_to_bf16(f16_to_float(values[i]));
        }
        break;
      }
      case DType::kF8E4M3: {
        Fp8BlockShape shape;
        PS_ASSIGN_OR_RETURN(std::vector<float> scales, fp8_scales(e, shape));
        const int64_t nan_at = dequantize_fp8_blocks_to_bf16(
            shape, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, scales, *out);
        if (nan_at >= 0) {
          return invalid_argument(file_of(e) + ": tensor '" + e.name +
                                  "' holds the E4M3 NaN code at [" +
                                  std::to_string(nan_at / shape.cols) + ", " +
                                  std::to_string(nan_at % shape.cols) + "] (a damaged weight)");
        }
        mark_used(*find(fp8_scale_inv_name(e.name)));
        break;
      }
      case DType::kI8: {
        if (find(int8_compensation_name(e.name)) != nullptr) {
          return unimplemented(file_of(e) + ": tensor '" + e.name +
                               "' carries an error compensation, which a dequantized (BF16) "
                               "use of the weight cannot apply");
        }
        PS_ASSIGN_OR_RETURN(std::vector<float> scales, int8_scales(e));
        const auto* q = reinterpret_cast<const int8_t*>(bytes.data());
        const int64_t cols = e.info->shape[1];
        // Symmetric INT8 stores [-127, 127], as the packed (kernel) path requires too.
        if (const int8_t* low = std::find(q, q + out->size(), int8_t{-128});
            low != q + out->size()) {
          const int64_t at = low - q;
          return invalid_argument(file_of(e) + ": tensor '" + e.name + "' stores -128 at row " +
                                  std::to_string(at / cols) + ", column " +
                                  std::to_string(at % cols) + " (symmetric INT8 is -127..127)");
        }
        for (size_t i = 0; i < out->size(); ++i) {
          (*out)[i] =
              float_to_bf16(static_cast<float>(q[i]) * scales[i / static_cast<size_t>(cols)]);
        }
        mark_used(*find(int8_scale_name(e.name)));
        break;
      }
      default:
        return unimplemented(file_of(e) + ": tensor '" + e.name + "' has dtype " +
                             std::string(dtype_name(e.info->dtype)) +
                             ", expected a float type (F32, BF16, F16, F8_E4M3) or I8 with scales");
    }
    return out;
  }

  Status prefetch() {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    constexpr size_t kChunk = size_t{64} << 20;
    const uint64_t file_total = [&] {
      uint64_t t = 0;
      for (const SafetensorsFile& s : shards) t += s.mapping()->size();
      return t;
    }();
    uint64_t done = 0;
    for (const SafetensorsFile& shard : shards) {
      const std::span<const std::byte> bytes = shard.mapping()->bytes();
      for (size_t begin = 0; begin < bytes.size(); begin += kChunk) {
        const size_t end = std::min(bytes.size(), begin + kChunk);
        shard.mapping()->advise_will_need(begin, end - begin);
        // Touch one byte per page so the pages are resident before the model reads them.
        unsigned sink = 0;
        for (size_t i = begin; i < end; i += page) sink += std::to_integer<unsigned>(bytes[i]);
        asm volatile("" : : "r"(sink));
        done += end - begin;
        if (options.progress) options.progress(done, file_total);
      }
    }
    return ok_status();
  }
};

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Result<Checkpoint> Checkpoint::open(const std::string& dir, const CheckpointOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->options = options;
  const fs::path root(dir);
  std::error_code ec;
  PS_RETURN_IF_ERROR(require_directory(root, "the model folder"));
  PS_ASSIGN_OR_RETURN(impl->config, load_model_config((root / "config.json").string()));

  // shard file name -> tensors the index assigns to it (empty for a single file).
  std::map<std::string, std::set<std::string>> shard_tensors;
  const std::string index_path = (root / kIndexFile).string();
  const bool sharded = fs::exists(index_path, ec);
  if (sharded) {
    PS_ASSIGN_OR_RETURN(std::string text, read_regular_file(index_path, kMaxIndexFileBytes));
    const json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return invalid_argument(index_path + ": not a valid JSON object");
    }
    PS_RETURN_IF_ERROR(check_json_nesting(index, kMaxIndexJsonDepth, index_path));
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return invalid_argument(index_path + ": missing object 'weight_map'");
    }
    for (const auto& [name, file] : map_it->items()) {
      if (!file.is_string()) {
        return invalid_argument(index_path + ": weight_map['" + name + "'] is not a file name");
      }
      const std::string shard = file.get<std::string>();
      // The path is handed to open(), which would end the name at the NUL: another file.
      if (shard.find('\0') != std::string::npos) {
        return invalid_argument(index_path + ": weight_map['" + name +
                                "'] holds a NUL byte, expected a file name");
      }
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        return invalid_argument(index_path + ": weight_map['" + name + "'] = '" + shard +
                                "', expected a file name in the checkpoint directory");
      }
      shard_tensors[shard].insert(name);
    }
  } else if (fs::exists(root / kSingleFile, ec)) {
    shard_tensors[kSingleFile];
  } else {
    return not_found(dir + ": no " + kIndexFile + " or " + kSingleFile + " found");
  }

  for (const auto& [shard_name, names] : shard_tensors) {
    PS_ASSIGN_OR_RETURN(SafetensorsFile shard, SafetensorsFile::open((root / shard_name).string()));
    if (sharded) {
      for (const std::string& name : names) {
        if (shard.find(name) == nullptr) {
          return not_found(index_path + ": weight_map puts tensor '" + name + "' in " +
                           shard.path() + ", which has no such tensor");
        }
      }
      for (const SafetensorsTensorInfo& t : shard.header().tensors) {
        if (!names.contains(t.name)) {
          return invalid_argument(shard.path() + ": tensor '" + t.name + "' is not listed in " +
                                  index_path + " for this shard");
        }
      }
    }
    impl->shards.push_back(std::move(shard));
  }

  for (size_t s = 0; s < impl->shards.size(); ++s) {
    for (const SafetensorsTensorInfo& t : impl->shards[s].header().tensors) {
      impl->entries.push_back({t.name, s, &t});
      impl->total_bytes += t.end - t.begin;
    }
  }
  std::sort(impl->entries.begin(), impl->entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (size_t i = 0; i < impl->entries.size(); ++i) {
    if (!impl->index.emplace(impl->entries[i].name, i).second) {
      return invalid_argument(dir + ": tensor '" + impl->entries[i].name +
                              "' is stored in more than one file");
    }
  }
  impl->used.assign(impl->entries.size(), false);
  if (options.prefetch) PS_RETURN_IF_ERROR(impl->prefetch());
  return Checkpoint(std::move(impl));
}

const ModelConfig& Checkpoint::config() const {
  return impl_->config;
}

const std::string& Checkpoint::dir() const {
  return impl_->dir;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const TensorEntry& e : impl_->entries) names.push_back(e.name);
  return names;
}

bool Checkpoint::contains(std::string_view name) const {
  return impl_->find(name) != nullptr;
}

Result<CheckpointTensorInfo> Checkpoint::info(std::string_view name) const {
  PS_ASSIGN_OR_RETURN(const TensorEntry* e, impl_->lookup(name));
  return CheckpointTensorInfo{e->name, impl_->file_of(*e), e->info->dtype, e->info->shape};
}

uint64_t Checkpoint::total_tensor_bytes() const {
  return impl_->total_bytes;
}

Result<WeightTensor> Checkpoint::get_raw(std::string_view name) {
  PS_ASSIGN_OR_RETURN(const TensorEntry* e, impl_->lookup(name));
  impl_->mark_used(*e);
  WeightTensor t;
  t.dtype = e->info->dtype;
  t.shape = e->info->shape;
  t.data = impl_->bytes_of(*e).data();
  t.storage = impl_->shards[e->shard].mapping();
  t.zero_copy = true;
  return t;
}

void Checkpoint::release_pages(std::string_view name) const {
  for (const std::string& n : {std::string(name), int8_scale_name(std::string(name)),
                               int8_compensation_name(std::string(name))}) {
    const TensorEntry* e = impl_->find(n);
    if (e == nullptr) continue;
    const SafetensorsFile& shard = impl_->shards[e->shard];
    const std::span<const std::byte> bytes = impl_->bytes_of(*e);
    shard.mapping()->release(static_cast<size_t>(bytes.data() - shard.mapping()->bytes().data()),
                             bytes.size());
  }
}

void Checkpoint::release_pages(const void* data, size_t bytes) const {
  const auto* begin = static_cast<const std::byte*>(data);
  for (const SafetensorsFile& shard : impl_->shards) {
    const std::span<const std::byte> mapped = shard.mapping()->bytes();
    const std::byte* lo = mapped.data();
    // Compared as integers: pointers into different objects are not ordered.
    const auto addr = reinterpret_cast<uintptr_t>(begin), first = reinterpret_cast<uintptr_t>(lo);
    if (addr >= first && addr - first <= mapped.size() && bytes <= mapped.size() - (addr - first)) {
      shard.mapping()->release(addr - first, bytes);
      return;
    }
  }
}

Result<Int8WeightTensor> Checkpoint::get_int8(std::string_view name,
                                              const std::vector<int64_t>& expected_shape) {
  PS_ASSIGN_OR_RETURN(const TensorEntry* e, impl_->lookup(name));
  PS_RETURN_IF_ERROR(impl_->check_shape(*e, expected_shape));
  if (e->info->dtype != DType::kI8) {
    return invalid_argument(impl_->file_of(*e) + ": tensor '" + e->name + "' has dtype " +
                            std::string(dtype_name(e->info->dtype)) + ", expected I8");
  }
  Int8WeightTensor t;
  PS_ASSIGN_OR_RETURN(t.scales, impl_->int8_scales(*e));
  PS_ASSIGN_OR_RETURN(t.compensation, impl_->int8_compensation(*e));
  if (!t.compensation.empty()) impl_->mark_used(*impl_->find(int8_compensation_name(e->name)));
  t.values = reinterpret_cast<const int8_t*>(impl_->bytes_of(*e).data());
  t.rows = e->info->shape[0];
  t.cols = e->info->shape[1];
  t.storage = impl_->shards[e->shard].mapping();
  impl_->mark_used(*e);
  impl_->mark_used(*impl_->find(int8_scale_name(e->name)));
  return t;
}

Result<WeightTensor> Checkpoint::get_bf16(std::string_view name,
                                          const std::vector<int64_t>& expected_shape) {
  PS_ASSIGN_OR_RETURN(const TensorEntry* e, impl_->lookup(name));
  PS_RETURN_IF_ERROR(impl_->check_shape(*e, expected_shape));
  const std::span<const std::byte> bytes = impl_->bytes_of(*e);
  WeightTensor t;
  t.dtype = DType::kBF16;
  t.shape = e->info->shape;
  if (e->info->dtype == DType::kBF16 &&
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(bf16) == 0) {
    t.data = bytes.data();
    t.storage = impl_->shards[e->shard].mapping();
    t.zero_copy = true;
  } else {
    std::shared_ptr<std::vector<bf16>> owned;
    {
      std::lock_guard<std::mutex> lock(impl_->converted_mutex);
      if (auto it = impl_->converted.find(e); it != impl_->converted.end()) {
        owned = it->second.lock();
      }
    }
    if (owned == nullptr) {
      PS_ASSIGN_OR_RETURN(owned, impl_->convert_to_bf16(*e));
      // The converted copy is what callers read: the stored bytes (FP8, F32) need not stay
      // resident beside it.
      release_pages(bytes.data(), bytes.size());
      std::lock_guard<std::mutex> lock(impl_->converted_mutex);
      if (auto held = impl_->converted[e].lock(); held != nullptr) {
        owned = std::move(held);  // another thread converted it meanwhile
      } else {
        impl_->converted[e] = owned;
      }
    }
    t.data = owned->data();
    t.storage = std::move(owned);
  }
  impl_->mark_used(*e);
  return t;
}

Result<std::vector<float>> Checkpoint::get_f32(std::string_view name,
                                               const std::vector<int64_t>& expected_shape) {
  PS_ASSIGN_OR_RETURN(const TensorEntry* e, impl_->lookup(name));
  PS_RETURN_IF_ERROR(impl_->check_shape(*e, expected_shape));
  std::vector<float> out;
  if (e->info->dtype == DType::kF32) {
    out = copy_elements<float>(impl_->bytes_of(*e));
  } else if (e->info->dtype == DType::kF16) {
    // Widened exactly: F16 has 3 more mantissa bits than BF16, which rounding would drop.
    const std::vector<uint16_t> halves = copy_elements<uint16_t>(impl_->bytes_of(*e));
    out.reserve(halves.size());
    for (uint16_t bits : halves) out.push_back(f16_to_float(bits));
  } else {
    PS_ASSIGN_OR_RETURN(std::shared_ptr<std::vector<bf16>> converted, impl_->convert_to_bf16(*e));
    out.reserve(converted->size());
    for (bf16 v : *converted) out.push_back(bf16_to_float(v));
  }
  // A damaged value is refused naming the tensor, as damaged scales are: these tensors are
  // read whole anyway (norms, biases, the router, the weights `quantize` rounds).
  const auto bad = std::find_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); });
  if (bad != out.end()) {
    int64_t flat = bad - out.begin();
    std::string at;
    for (auto d = e->info->shape.rbegin(); d != e->info->shape.rend(); ++d) {
      at = std::to_string(flat % std::max<int64_t>(*d, 1)) + (at.empty() ? "" : ", ") + at;
      flat /= std::max<int64_t>(*d, 1);
    }
    return invalid_argument(impl_->file_of(*e) + ": tensor '" + e->name +
                            "' has a non-finite value (" + std::to_string(*bad) + ") at [" + at +
                            "]");
  }
  impl_->mark_used(*e);
  return out;
}

std::vector<std::string> Checkpoint::unused_tensors() const {
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(impl_->used_mutex);
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    if (!impl_->used[i]) names.push_back(impl_->entries[i].name);
  }
  return names;
}

Status Checkpoint::check_all_used() const {
  const std::vector<std::string> unused = unused_tensors();
  if (unused.empty()) return ok_status();
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 5; ++i) {
    const TensorEntry* e = impl_->find(unused[i]);
    list += (i ? ", " : "") + std::string("'") + unused[i] + "' (" + impl_->file_of(*e) + ")";
  }
  if (unused.size() > 5) list += ", ...";
  return invalid_argument(impl_->dir + ": " + std::to_string(unused.size()) +
                          " unexpected tensor(s) that the model does not use: " + list);
}

Status Checkpoint::validate_layout() const {
  const Impl& im = *impl_;
  std::set<std::string, std::less<>> expected;
  std::vector<std::string> missing;
  for (const TensorSpec& spec : deepseek_tensor_layout(im.config)) {
    expected.insert(spec.name);
    const TensorEntry* e = im.find(spec.name);
    if (e == nullptr) {
      missing.push_back(spec.name + " " + shape_string(spec.shape));
      continue;
    }
    PS_RETURN_IF_ERROR(im.check_shape(*e, spec.shape));
    const DType dtype = e->info->dtype;
    const bool float_type = dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
    const bool fp8_allowed = spec.role != TensorRole::kNorm && spec.role != TensorRole::kRouterBias;
    if (dtype == DType::kF8E4M3 && fp8_allowed) {
      Fp8BlockShape shape;
      PS_RETURN_IF_ERROR(im.fp8_scales(*e, shape).status());
      expected.insert(fp8_scale_inv_name(spec.name));
    } else if (dtype == DType::kI8 && is_int8_storable(spec.role)) {
      PS_RETURN_IF_ERROR(im.int8_scales(*e).status());
      expected.insert(int8_scale_name(spec.name));
      PS_ASSIGN_OR_RETURN(std::vector<float> compensation, im.int8_compensation(*e));
      if (!compensation.empty()) expected.insert(int8_compensation_name(spec.name));
    } else if (!float_type) {
      return invalid_argument(im.file_of(*e) + ": tensor '" + spec.name + "' has dtype " +
                              std::string(dtype_name(dtype)) + ", expected F32, BF16 or F16" +
                              (fp8_allowed ? " (or F8_E4M3 with block scales)" : "") +
                              (is_int8_storable(spec.role) ? " (or I8 with per-row scales)" : ""));
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ...";
    return not_found(im.dir + ": " + std::to_string(missing.size()) +
                     " tensor(s) missing from the checkpoint: " + list);
  }
  for (const TensorEntry& e : im.entries) {
    if (!expected.contains(e.name)) {
      return invalid_argument(im.file_of(e) + ": unexpected tensor '" + e.name +
                              "' (not part of the DeepSeek layout for this config.json)");
    }
  }
  return ok_status();
}

}  // namespace peerserve
