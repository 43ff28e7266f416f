// A Hugging Face DeepSeek-V3-family checkpoint directory, opened for loading:
// config.json -> ModelConfig, then model.safetensors.index.json (sharded) or
// model.safetensors (single file), every shard memory-mapped.
//
// Typical use by the model:
//   PS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir, options));
//   PS_ASSIGN_OR_RETURN(WeightTensor w, ckpt.get_bf16("model.embed_tokens.weight", {V, H}));
//   PS_ASSIGN_OR_RETURN(std::vector<float> g, ckpt.get_f32("model.norm.weight", {H}));
//   ...
//   PS_RETURN_IF_ERROR(ckpt.check_all_used());  // no unexpected tensors left over
//
// Thread-safety: after open(), all const methods and get_* may be called from several
// threads at once (loading weights in parallel).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/model_config.h"
#include "tensor/dtype.h"
#include "tensor/float_convert.h"

namespace peerserve {

// Called with (bytes done, bytes total); `total` is the sum of all tensor bytes.
using LoadProgressCallback = std::function<void(uint64_t done, uint64_t total)>;

struct CheckpointOptions {
  // Reports progress while shards are prefetched at open and as tensors are read by get_*.
  // Default: none. Called from the thread doing the work; must be thread-safe if get_* is
  // called concurrently.
  LoadProgressCallback progress;
  // Read every shard into the page cache during open() (touching each page), so that the
  // later get_* calls do not stall on disk; progress is reported as it goes. Default: false
  // (pages load lazily on first touch).
  bool prefetch = false;
};

// A tensor as handed to the model: dtype, shape and a pointer to its elements
// (row-major, contiguous). `storage` keeps the memory alive: either the shard's mapping
// (zero-copy views) or an owned buffer (converted or dequantized data), so a WeightTensor
// stays valid after the Checkpoint is destroyed.
struct WeightTensor {
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::shared_ptr<const void> storage;
  bool zero_copy = false;  // true: `data` points into the file mapping

  int64_t numel() const;
  size_t nbytes() const;
  // REQUIRES: dtype == kBF16.
  const bf16* bf16_data() const;
};

// An INT8 weight [rows, cols] as stored (I8, zero-copy) with its per-row scales.
struct Int8WeightTensor {
  const int8_t* values = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> scales;  // [rows]
  std::shared_ptr<const void> storage;
  std::vector<float> compensation;  // [rows] added to the product's output, or empty: none
};

// Where a tensor lives and how it is stored.
struct CheckpointTensorInfo {
  std::string name;
  std::string file;  // shard path
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class Checkpoint {
 public:
  // Errors name the file (and tensor): missing config.json / shard, bad config field,
  // malformed safetensors header, index naming a missing shard or a tensor absent from its
  // shard, a tensor present in two shards.
  static Result<Checkpoint> open(const std::string& dir, const CheckpointOptions& options = {});

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const ModelConfig& config() const;
  const std::string& dir() const;
  // Every stored tensor name (including *_scale_inv companions), sorted.
  std::vector<std::string> tensor_names() const;
  bool contains(std::string_view name) const;
  Result<CheckpointTensorInfo> info(std::string_view name) const;
  // Sum of the byte sizes of all stored tensors.
  uint64_t total_tensor_bytes() const;

  // The tensor as a BF16 matrix of `expected_shape`: BF16 zero-copy from the mapping (when
  // 2-byte aligned), F32/F16 converted, F8_E4M3 dequantized with "<name>_scale_inv" and the
  // config's weight_block_size, I8 dequantized with "<name>_scale" (per row). Marks the
  // tensor (and its scale) as used. A converted tensor asked for again while its earlier
  // copy is still held gives that copy (the same data pointer).
  // Errors: NotFound (file is the checkpoint dir), InvalidArgument on shape mismatch
  // ("<file>: tensor '<name>' has shape [a, b], expected [c, d]"), Unimplemented dtype.
  Result<WeightTensor> get_bf16(std::string_view name, const std::vector<int64_t>& expected_shape);
  // The tensor converted to float (for norms, biases, router weights, and the weights that
  // `quantize` rounds): F32 read exactly, BF16 and F16 widened exactly, F8_E4M3 dequantized
  // with its scales (rounded to BF16 on the way).
  // Marks it used.
  Result<std::vector<float>> get_f32(std::string_view name,
                                     const std::vector<int64_t>& expected_shape);
  // An I8 weight and its "<name>_scale" ([rows, 1] or [rows]; F32, BF16 or F16, finite,
  // >= 0), and its "<name>_compensation" when present (F32 [rows], finite). Marks them used.
  // Errors name the tensor: not I8, shape mismatch, scale missing or misshaped, a misshaped
  // or non-F32 compensation.
  Result<Int8WeightTensor> get_int8(std::string_view name,
                                    const std::vector<int64_t>& expected_shape);
  // The process no longer needs the stored bytes of `name` (and of its scale and compensation
  // companions) resident, e.g. an INT8 weight repacked into the kernels' layout: drops their
  // pages from memory (they are read from the file again if touched). No-op for an unknown
  // name.
  void release_pages(std::string_view name) const;
  // The same for the bytes [data, data + bytes) when they lie in one of the checkpoint's
  // mapped shards (a zero-copy tensor view, e.g. a BF16 weight repacked at load); no-op for
  // any other memory (an owned, converted copy).
  void release_pages(const void* data, size_t bytes) const;
  // The tensor exactly as stored, zero-copy (any dtype). Marks it used.
  Result<WeightTensor> get_raw(std::string_view name);

  // Names of stored tensors that no get_* call has read yet, sorted (scale companions count
  // as read with their weight).
  std::vector<std::string> unused_tensors() const;
  // InvalidArgument listing (the first few) unused tensors, if any.
  Status check_all_used() const;

  // Compares the stored tensors with deepseek_tensor_layout(config()) without reading
  // any data: missing tensors, unexpected ones, shape mismatches, dtypes not allowed for the
  // role, FP8 weights without (or with wrongly shaped) scale_inv. Returns the first error,
  // naming file and tensor.
  Status validate_layout() const;

 private:
  struct Impl;
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
