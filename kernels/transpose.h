// A cache-blocked matrix transpose, for rearranging activations (attention keys) so that a
// product reads them as contiguous rows. A copy: exact at any tiling.
#pragma once

#include <algorithm>
#include <cstdint>

namespace peerserve::kernels {

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols. The naive loop
// stores every element to a different cache line when the destination rows are long; tiles
// of kTile source rows write kTile contiguous floats per destination row instead, and keep
// the tile's source lines in L1 across the columns.
template <typename T>
void transpose(const T* src, int64_t src_stride, int64_t rows, int64_t cols, T* dst,
               int64_t dst_stride) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c = 0; c < cols; ++c) {
      T* out = dst + c * dst_stride;
      for (int64_t r = r0; r < r1; ++r) out[r] = src[r * src_stride + c];
    }
  }
}

}  // namespace peerserve::kernels
