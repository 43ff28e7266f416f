#include "dist/split_mlp_backend.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "kernels/activation.h"
#include "model/weight_packing.h"

namespace peerserve::dist {
namespace {

// Rows [begin, begin + rows) of w: a view of the same storage (row-major [rows, cols]).
LinearWeight row_slice(const LinearWeight& w, int64_t begin, int64_t rows) {
  LinearWeight slice;
  slice.data = w.data + begin * w.cols;
  slice.rows = rows;
  slice.cols = w.cols;
  slice.storage = w.storage;
  return slice;
}

bool has_int8_form(const MlpWeights& w) {
  return w.gate_up_int8 || w.gate.int8 || w.up.int8 || w.down.int8;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v, int64_t count) {
  return std::as_bytes(std::span<const T>(v.data(), static_cast<size_t>(count)));
}

}  // namespace

Result<std::unique_ptr<SplitMlpBackend>> SplitMlpBackend::create(SplitMlpBackendOptions options) {
  if (options.communicator == nullptr) return invalid_argument("split MLPs: no communicator");
  if (options.max_rows_per_rank < 0) {
    return invalid_argument("split MLPs: max rows per rank " +
                            std::to_string(options.max_rows_per_rank) + ", expected >= 0");
  }
  const int ranks = options.communicator->size(), rank = options.communicator->rank();
  const int64_t hidden = options.hidden_size;
  std::vector<std::optional<Slice>> slices(options.mlps_by_layer.size());
  for (size_t layer = 0; layer < slices.size() && options.max_rows_per_rank > 0; ++layer) {
    const MlpWeights* w = options.mlps_by_layer[layer];
    if (w == nullptr || has_int8_form(*w) || w->gate.data == nullptr) continue;
    const int64_t inter = w->gate.rows;
    if (w->gate.cols != hidden || w->up.rows != inter || w->up.cols != hidden ||
        w->down.rows != hidden || w->down.cols != inter || w->up.data == nullptr ||
        w->down.data == nullptr) {
      return invalid_argument("split MLPs: layer " + std::to_string(layer) +
                              ": gate/up/down are not [I, " + std::to_string(hidden) + "], [I, " +
                              std::to_string(hidden) + "], [" + std::to_string(hidden) + ", I]");
    }
    if (inter % ranks != 0 || hidden % ranks != 0) continue;
    Slice s;
    s.inter = inter / ranks;
    s.mlp.gate = row_slice(w->gate, rank * s.inter, s.inter);
    s.mlp.up = row_slice(w->up, rank * s.inter, s.inter);
    s.mlp.down = row_slice(w->down, rank * (hidden / ranks), hidden / ranks);
    // The slices take the form the whole weights have, so that linear() picks the same
    // kernel for them.
    if (w->gate.bf16_packed) PS_RETURN_IF_ERROR(pack_mlp_bf16(s.mlp));
    slices[layer] = std::move(s);
  }
  int64_t max_part = 0;
  for (const std::optional<Slice>& s : slices)
    max_part = s ? std::max(max_part, s->inter) : max_part;
  auto backend = std::make_unique<SplitMlpBackend>(std::move(options), std::move(slices), max_part);
  if (max_part > 0) PS_RETURN_IF_ERROR(backend->init_window());
  return backend;
}

namespace {

constexpr size_t kLine = 64;

size_t round_up(size_t bytes) {
  return (bytes + kLine - 1) / kLine * kLine;
}

}  // namespace

SplitMlpBackend::SplitMlpBackend(SplitMlpBackendOptions options,
                                 std::vector<std::optional<Slice>> slices, int64_t max_part)
    : options_(std::move(options)), slices_(std::move(slices)), max_part_(max_part) {
  ranks_ = options_.communicator->size();
  if (max_part_ == 0) return;  // nothing to split: no buffers
  const int64_t hidden = options_.hidden_size, cap = options_.max_rows_per_rank;
  const int64_t most_rows = cap * ranks_, hidden_part = hidden / ranks_;
  const size_t rows_bytes = kLine + static_cast<size_t>(cap * hidden) * sizeof(float);
  gather_bytes_[0] = gather_bytes_[1] = round_up(rows_bytes);
  gather_bytes_[2] = round_up(static_cast<size_t>(most_rows * max_part_) * sizeof(float));
  gather_bytes_[3] = round_up(static_cast<size_t>(most_rows * hidden_part) * sizeof(float));
  size_t offset = static_cast<size_t>(kGathers * ranks_) * kLine;  // the flags
  for (int g = 0; g < kGathers; ++g) {
    gather_offset_[g] = offset;
    offset += gather_bytes_[g] * ranks_;
  }
  send_.resize(rows_bytes);
  counts_.resize(ranks_);
  x_all_.resize(most_rows * hidden);
  gate_.resize(most_rows * max_part_);
  up_.resize(most_rows * max_part_);
  inter_.resize(most_rows * max_part_ * ranks_);
  down_.resize(most_rows * hidden_part);
}

Status SplitMlpBackend::init_window() {
  const size_t bytes = gather_offset_[kGathers - 1] + gather_bytes_[kGathers - 1] * ranks_;
  PS_ASSIGN_OR_RETURN(window_, options_.communicator->create_window(bytes, options_.peer_timeout));
  for (int r = 0; r < ranks_; ++r) direct_.push_back(window_->direct(r));
  return ok_status();
}

Status SplitMlpBackend::all_gather(int gather, std::span<const std::byte> mine, const char* what) {
  const int me = options_.communicator->rank();
  const size_t place = gather_offset_[gather] + gather_bytes_[gather] * me;
  const size_t flag = static_cast<size_t>(gather * ranks_ + me) * kLine;
  for (int r = 0; r < ranks_; ++r) {
    if (direct_[r] != nullptr) {
      if (!mine.empty()) std::memcpy(direct_[r] + place, mine.data(), mine.size());
    } else if (!mine.empty()) {
      PS_RETURN_IF_ERROR(window_->put(r, place, mine));
    }
    PS_RETURN_IF_ERROR(window_->signal(r, flag, sequence_));
  }
  const Clock::time_point deadline = Clock::now() + options_.peer_timeout;
  for (int r = 0; r < ranks_; ++r) {
    const size_t from = static_cast<size_t>(gather * ranks_ + r) * kLine;
    Status status = window_->wait_at_least(from, sequence_, r, what, deadline);
    if (!status.ok()) {
      return status.with_context("split MLP call " + std::to_string(sequence_) + " (timeout " +
                                 std::to_string(options_.peer_timeout.count()) + " ms)");
    }
  }
  return ok_status();
}

const std::byte* SplitMlpBackend::received(int gather, int source) const {
  return window_->local().data() + gather_offset_[gather] + gather_bytes_[gather] * source;
}

int SplitMlpBackend::split_layers() const {
  int n = 0;
  for (const std::optional<Slice>& s : slices_) n += s.has_value();
  return n;
}

Result<bool> SplitMlpBackend::run(const ComputeContext& ctx, int64_t layer, const float* x,
                                  int64_t rows, float* out) {
  if (layer < 0 || layer >= static_cast<int64_t>(slices_.size()) || !slices_[layer]) return false;
  const Slice& s = *slices_[layer];
  const int me = options_.communicator->rank();
  const int64_t hidden = options_.hidden_size, cap = options_.max_rows_per_rank;
  const int64_t part = s.inter, inter = part * ranks_, hidden_part = hidden / ranks_;
  ++sequence_;
  const int rows_gather = static_cast<int>(sequence_ & 1);

  // Gather 1: row counts and rows.
  std::memcpy(send_.data(), &rows, sizeof rows);
  size_t send_bytes = kLine;
  if (rows > 0 && rows <= cap) {
    std::memcpy(send_.data() + kLine, x, static_cast<size_t>(rows * hidden) * sizeof(float));
    send_bytes += static_cast<size_t>(rows * hidden) * sizeof(float);
  }
  PS_RETURN_IF_ERROR(all_gather(rows_gather, {send_.data(), send_bytes}, "its rows"));
  std::vector<int64_t>& count = counts_;
  int64_t total = 0, mine = 0;
  bool fits = true;
  for (int r = 0; r < ranks_; ++r) {
    std::memcpy(&count[r], received(rows_gather, r), sizeof(int64_t));
    if (count[r] < 0) {
      return internal_error("split MLP call " + std::to_string(sequence_) + ": rank " +
                            std::to_string(r) + " sent a row count of " + std::to_string(count[r]));
    }
    fits = fits && count[r] <= cap;
    if (r == me) mine = total;
    total += count[r];
  }
  if (!fits) return false;  // every rank sees the same counts
  ++split_calls_;
  if (total == 0) return true;
  int64_t row = 0;
  for (int r = 0; r < ranks_; ++r) {
    std::memcpy(x_all_.data() + row * hidden, received(rows_gather, r) + kLine,
                static_cast<size_t>(count[r] * hidden) * sizeof(float));
    row += count[r];
  }

  // This rank's intermediate columns for every row; gather 2 makes the whole intermediate.
  const LinearProblem gate_up[2] = {
      {.x = x_all_.data(), .w = &s.mlp.gate, .y = gate_.data(), .m = total},
      {.x = x_all_.data(), .w = &s.mlp.up, .y = up_.data(), .m = total}};
  grouped_bf16_linear(ctx, gate_up);
  kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), total * part);
  PS_RETURN_IF_ERROR(all_gather(2, bytes_of(gate_, total * part), "its intermediate columns"));
  for (int r = 0; r < ranks_; ++r) {
    const float* block = reinterpret_cast<const float*>(received(2, r));
    for (int64_t t = 0; t < total; ++t) {
      std::memcpy(inter_.data() + t * inter + r * part, block + t * part,
                  static_cast<size_t>(part) * sizeof(float));
    }
  }

  // This rank's output columns for every row; gather 3, and each rank keeps its own rows.
  linear(ctx, inter_.data(), total, s.mlp.down, down_.data());
  PS_RETURN_IF_ERROR(all_gather(3, bytes_of(down_, total * hidden_part), "its output columns"));
  for (int r = 0; r < ranks_; ++r) {
    const float* block = reinterpret_cast<const float*>(received(3, r));
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(out + i * hidden + r * hidden_part, block + (mine + i) * hidden_part,
                  static_cast<size_t>(hidden_part) * sizeof(float));
    }
  }
  return true;
}

}  // namespace peerserve::dist
