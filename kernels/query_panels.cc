#include "kernels/query_panels.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/bf16_convert.h"
#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels {
namespace {

constexpr int64_t kPanel = QueryPanels::kHeadsPerPanel;

}  // namespace

void QueryPanels::pack(const float* q, int64_t q_stride, int64_t heads, int64_t width) {
  PS_CHECK(heads >= 1 && supports_width(width) && q_stride >= width)
      << "query panels: heads=" << heads << " width=" << width << " q_stride=" << q_stride;
  const int64_t k_pairs = width / 2, panels = (heads + kPanel - 1) / kPanel;
  // As PackedBf16Matrix: one cache line more when a panel is a multiple of 4 KiB.
  panel_stride_ = k_pairs * 2 * kPanel;
  if ((panel_stride_ * 2) % 4096 == 0) panel_stride_ += 32;
  const size_t elements = static_cast<size_t>(panels * panel_stride_);
  if (storage_.size() < elements + 32) storage_.resize(elements + 32);
  const auto base = reinterpret_cast<uintptr_t>(storage_.data());
  panels_ = storage_.data() + (((base + 63) & ~uintptr_t{63}) - base) / sizeof(uint16_t);
  heads_ = heads;
  width_ = width;

  // Head h's pair g goes to panel h / 16, line g, lane h % 16; lanes past `heads` are zero.
  std::fill_n(panels_, elements, uint16_t{0});
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
