// DeepSeek-V3's FP8 weight format: a [rows, cols] F8_E4M3 matrix W plus a float matrix
// `weight_scale_inv` S of shape [ceil(rows / br), ceil(cols / bc)] (br x bc =
// quantization_config.weight_block_size, [128, 128] in V3). The real weight is
//   W_real[r][c] = float(W[r][c]) * S[r / br][c / bc];
// edge blocks may be partial (rows or cols not a multiple of the block size).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tensor/float_convert.h"

namespace peerserve {

struct Fp8BlockShape {
  int64_t rows = 0, cols = 0;                  // the weight matrix
  int64_t block_rows = 128, block_cols = 128;  // weight_block_size

  int64_t scale_rows() const { return (rows + block_rows - 1) / block_rows; }
  int64_t scale_cols() const { return (cols + block_cols - 1) / block_cols; }
};

// out = W * S (as above), rounded to BF16 (round to nearest even). Returns the index of the
// first NaN code (0x7f or 0xff: E4M3 has no infinities), whose output is NaN, or -1 if none.
// REQUIRES: weight.size() == out.size() == rows * cols, scale_inv.size() == scale_rows *
// scale_cols, positive block sizes.
int64_t dequantize_fp8_blocks_to_bf16(const Fp8BlockShape& shape, std::span<const uint8_t> weight,
                                      std::span<const float> scale_inv, std::span<bf16> out);

struct Fp8BlockQuantized {
  std::vector<uint8_t> weight;   // rows * cols F8_E4M3 codes
  std::vector<float> scale_inv;  // scale_rows * scale_cols
};

// The inverse, as DeepSeek's weight_quant does: per block S = amax / 448 (1 for an all-zero
// block), W = f8e4m3(W_real / S). Used by the test-model writer.
Fp8BlockQuantized quantize_fp8_blocks(const Fp8BlockShape& shape, std::span<const float> values);

}  // namespace peerserve
