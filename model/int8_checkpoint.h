// Offline W8A8 quantization: an INT8 copy of a BF16, F32 or block-FP8 checkpoint
// (`peerserve quantize`, docs/quantization.md).
//
// What is quantized is the table of docs/quantization.md, as at load time: attention
// q_a / q_b / q_proj, kv_a, o_proj, the MTP eh_proj, and every dense, shared and routed
// expert gate / up / down become I8 per output channel (round to nearest, absmax / 127,
// exactly kernels::quantize_int8_row) with an F32 "<name>_scale" [out, 1]; the output heads
// too unless `lm_head` is false. kv_b, norms, the router and the embeddings keep their
// precision (FP8 ones become BF16). config.json gets a compressed-tensors
// `quantization_config` (W8A8 int, channel-wise weights, dynamic per-token activations) that
// names the unquantized linear modules in "ignore"; tokenizer and other files are copied.
//
// Loading the result gives the same INT8 weights as `--quantize int8` on a BF16 or FP8
// source (with `--quantize-lm-head` when the heads were quantized), so the same logits,
// without the BF16 weights in memory. Not on an F32 source (quantized here from the stored
// values, at load after rounding to BF16) nor for a tied head (the embedding table, kept
// BF16 here).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/checkpoint/checkpoint.h"
#include "model/int8_calibration.h"

namespace peerserve {

struct Int8CheckpointOptions {
  // Quantize lm_head (and the MTP shared head). Default true: measured at no perplexity cost
  // (docs/quantization.md), and at a real vocabulary it is the largest read of a decode step.
  bool lm_head = true;
  // Shards are cut before this size. Default 2 GiB.
  uint64_t max_shard_bytes = 2ull << 30;
  // (source bytes processed, source bytes total). Default: none.
  LoadProgressCallback progress;
  // Calibration transforms (model/int8_calibration.h) applied before quantizing: weight
  // columns times s, norm weights divided by s (kept in their dtype: s is a power of two),
  // per-row clipping, and error compensations written as "<name>_compensation" (F32 [out]).
  // Default: none (round to nearest).
  const Int8Transforms* transforms = nullptr;
  // Testing: false writes the transformed weights in their source dtype instead of INT8 (and
  // no quantization_config), i.e. the smoothed BF16 model. Default true.
  bool quantize_weights = true;
};

struct Int8CheckpointSummary {
  int64_t quantized_tensors = 0;
  int64_t kept_tensors = 0;
  uint64_t bytes_in = 0;   // tensor bytes of the source
  uint64_t bytes_out = 0;  // tensor bytes written
};

// Whether `out_dir` may receive the INT8 copy of `in_dir`: it must not be the source, and
// must not exist or be an empty directory (nothing is ever overwritten, so no running
// server's mapped files are truncated and no half-written copy is mistaken for a whole one).
// Cheap: `peerserve quantize` checks it before calibrating.
Status check_int8_output_dir(const std::string& in_dir, const std::string& out_dir);

// Writes the INT8 checkpoint of `in_dir` into `out_dir`. Everything is written into a
// sibling staging directory (`out_dir` + ".partial-<host>-<pid>"), renamed to `out_dir` once
// complete and removed on any error, so `out_dir` either holds a whole checkpoint or does not
// exist. Errors: those of check_int8_output_dir, a source that is already INT8 or fails
// validate_layout(), I/O errors naming the path.
Result<Int8CheckpointSummary> write_int8_checkpoint(const std::string& in_dir,
                                                    const std::string& out_dir,
                                                    const Int8CheckpointOptions& options = {});

}  // namespace peerserve
