#include "kernels/query_panels.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "base/check.h"
#include "kernels/bf16_convert.h"
#include "kernels/bf16_matrix.h"
#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels {
namespace {

constexpr int64_t kPanel = QueryPanels::kHeadsPerPanel;

}  // namespace

void QueryPanels::pack(const float* q, int64_t q_stride, int64_t heads, int64_t width) {
  PS_CHECK(heads >= 1 && supports_width(width) && q_stride >= width)
      << "query panels: heads=" << heads << " width=" << width << " q_stride=" << q_stride;
  const int64_t k_pairs = width / 2, panels = (heads + kPanel - 1) / kPanel;
  panel_stride_ = PackedBf16Matrix::panel_stride_for(width);
  const int64_t bytes = panels * panel_stride_ * static_cast<int64_t>(sizeof(uint16_t));
  if (storage_.size() < bytes) {
    Result<AlignedBuffer> storage = AlignedBuffer::allocate(bytes);
    PS_CHECK(storage.ok()) << "query panels: " << storage.status().message();
    storage_ = std::move(storage).value();
  }
  panels_ = reinterpret_cast<uint16_t*>(storage_.data());
  heads_ = heads;
  width_ = width;

  // Head h's pair g goes to panel h / 16, line g, lane h % 16. Lanes past `heads` (in the
  // last panel only) are zeroed; every other lane is written below.
  if (heads % kPanel != 0) {
    std::fill_n(panels_ + (panels - 1) * panel_stride_, panel_stride_, uint16_t{0});
  }
  thread_local std::vector<bf16> row;
  row.resize(static_cast<size_t>(width));
  for (int64_t h = 0; h < heads; ++h) {
    fp32_to_bf16(q + h * q_stride, row.data(), width);
    uint16_t* lane = panels_ + (h / kPanel) * panel_stride_ + 2 * (h % kPanel);
    for (int64_t g = 0; g < k_pairs; ++g) {
      std::memcpy(lane + 2 * kPanel * g, &row[static_cast<size_t>(2 * g)], 2 * sizeof(bf16));
    }
  }
}

void QueryPanels::score(const bf16* keys, int64_t key_stride, int64_t tokens, float* scores,
                        int64_t scores_stride) const {
  PS_CHECK(panels_ != nullptr) << "query panels: score before pack";
  PS_CHECK(key_stride >= width_ && key_stride % 2 == 0 && scores_stride >= heads_)
      << "query panels: key_stride=" << key_stride << " scores_stride=" << scores_stride
      << " for width " << width_ << ", " << heads_ << " heads";
  if (tokens <= 0) return;
  internal::PackedBf16Tile tile;
  tile.x = &keys->bits;
  tile.x_stride = key_stride;
  tile.m = tokens;
  tile.w = panels_;
  tile.panel_stride = panel_stride_;
  tile.k_pairs = width_ / 2;
  tile.panel_begin = 0;
  tile.panel_end = (heads_ + kPanel - 1) / kPanel;
  tile.y = scores;
  tile.y_stride = scores_stride;
  tile.n = heads_;
  tile.accumulate = false;
  internal::active_kernel_table().matmul_packed_bf16(tile);
}

}  // namespace peerserve::kernels
