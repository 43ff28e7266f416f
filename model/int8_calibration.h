// Calibration for the offline INT8 checkpoint (`peerserve quantize --calib`,
// docs/quantization.md): paper 000 §4.5's training-free pipeline, each step switchable.
//
// calibrate_int8() runs the BF16 model over calibration tokens with a LinearInputRecorder
// (model/forward_step.h) and records, per quantized linear weight, the per-input-channel
// absmax of its input and a reservoir sample of input rows. The steps then choose, on that
// sample, transforms that write_int8_checkpoint() applies:
//
//  - smoothing (SmoothQuant): for the weights that read an RMSNorm output (q_a or q_proj and
//    kv_a: input_layernorm; q_b: q_a_layernorm; dense / shared / routed gate and up:
//    post_attention_layernorm, whose output the router also reads; lm_head: the final norm,
//    only without an MTP layer, which reads the final norm's output too)
//    one per-input-channel s per group: weight columns times s, the norm weight divided by s,
//    the router's columns times s. s is rounded to a power of two, so the transform is exact
//    in BF16 and fp32 (the BF16 model's logits and routing do not change at all) and the
//    norm and router keep their dtype. s_j = max|X_j|^a / max|W_:,j|^(1-a), a = 0.5.
//  - scale search (paper eq. 3): the same s with a searched on 0, 0.1, ..., 1 per group.
//  - clipping (eq. 4): per output row, the range clipped to c * absmax, c in 1, 0.95, ...,
//    0.75.
//  - error compensation: per output row of a weight, the mean over the sample of
//    W X - Q(W s) Qa(X / s) (the systematic part of the quantization error, e.g. from inputs
//    with a non-zero mean), stored with the weight and added to its product's output. It is
//    estimated on the even sample rows and kept for a weight only where it lowers the error
//    on the odd rows (then re-estimated on all of them). Not for gate/up projections, whose
//    outputs go through the fused SiLU (kernels/matmul_int8.h).
// Every choice minimizes the objective sum ||Q(W s) Qa(X / s) - W X||^2 over the group's
// weights and their sampled inputs (Q: per-output-channel RTN; Qa: per-token absmax/127 as
// the kernels), and the untransformed choice (s = 1, c = 1) is always a candidate, so no step
// ever raises a group's objective over round to nearest.
//
// Not calibrated: the MTP layer (the forward does not run it),
// dense-layer gate/up (their BF16 product in DeepseekModel::run_mlp has no recording hook; the
// group stays round to nearest), an lm_head tied to the embeddings. Needs a BF16 source (the
// recorder identifies weights by their checkpoint view).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace peerserve {

struct Int8PipelineOptions {
  bool smooth = false;        // SmoothQuant with a = 0.5 (kept per group only where it helps)
  bool scale_search = false;  // a searched per group (includes 0.5 and no smoothing)
  bool clip = false;          // per-row clipping ratio searched
  bool compensate = false;    // error compensation where it lowers held-out error
  bool any() const { return smooth || scale_search || clip || compensate; }
};

// Parses rtn, or steps joined by '+': smooth, search, clip, compensate, full (= search+clip);
// e.g. "full+compensate".
Result<Int8PipelineOptions> parse_int8_pipeline(const std::string& name);

struct CalibrationOptions {
  Int8PipelineOptions pipeline;
  int64_t window = 256;           // tokens per forward, [BOS] included
  int64_t max_sample_rows = 256;  // sampled input rows kept per weight
  bool lm_head = true;            // the heads will be quantized (then the final norm group too)
  // Keep smoothing only where it lowers the group's objective (default). False applies the
  // best smoothing candidate even when round to nearest was better (tests, ablations).
  bool guard = true;
  int num_threads = 0;
};

// The objective of one group (or one unsmoothed weight) on the sample.
struct CalibrationGroupReport {
  std::string name;           // e.g. "model.layers.1.post_attention_layernorm"
  int64_t weights = 0;        // linear weights in the group
  int64_t sample_rows = 0;    // rows summed over the weights' samples
  double reference = 0;       // sum ||W X||^2
  double rtn_error = 0;       // sum ||Q(W) Qa(X) - W X||^2
  double smoothed_error = 0;  // after smoothing / scale search (== rtn_error without them)
  double error = 0;           // final (after clipping too)
  float alpha = -1;           // chosen smoothing exponent; -1: no smoothing
  double mean_clip = 1;       // mean clipping ratio over the rows
  // Error compensation, on the odd sample rows of the weights that can take one: the error
  // without and with it (estimated on the even rows), and the weights that keep it.
  double compensation_before = 0;
  double compensation_after = 0;
  int64_t compensated_weights = 0;
};

// What write_int8_checkpoint applies (by tensor name).
struct Int8Transforms {
  // Columns of a linear weight (quantized ones and the router gate) multiplied by s.
  std::map<std::string, std::shared_ptr<const std::vector<float>>> column_scale;
  // Norm weights divided by s.
  std::map<std::string, std::shared_ptr<const std::vector<float>>> norm_divisor;
  // Per-row clipping ratio of a quantized weight (scale = ratio * absmax / 127).
  std::map<std::string, std::vector<float>> row_clip;
  // Per-row error compensation of a quantized weight (written as "<name>_compensation").
  std::map<std::string, std::vector<float>> compensation;
  std::vector<CalibrationGroupReport> groups;
  int64_t tokens = 0;  // calibration tokens run
};

// Runs the BF16 model in `checkpoint_dir` over `tokens` (windows of options.window, [BOS] =
// bos_id first) and computes the transforms of options.pipeline.
Result<Int8Transforms> calibrate_int8(const std::string& checkpoint_dir,
                                      std::span<const int32_t> tokens, int32_t bos_id,
                                      const CalibrationOptions& options);

}  // namespace peerserve
