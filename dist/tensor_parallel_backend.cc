#include "dist/tensor_parallel_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "base/check.h"
#include "kernels/activation.h"
#include "model/weight_packing.h"

namespace peerserve::dist {
namespace {

constexpr size_t kLine = 64;
// A row gather's header: int64 rows, int32 1 when loads follow, int32 loads[ranks].
constexpr size_t kLoadsFlagAt = 8, kLoadsAt = 12;
constexpr int kMaxBalancedRanks = static_cast<int>((kLine - kLoadsAt) / sizeof(int32_t));

size_t round_up(size_t bytes) {
  return (bytes + kLine - 1) / kLine * kLine;
}

size_t float_bytes(int64_t count) {
  return static_cast<size_t>(count) * sizeof(float);
}

// Rows [begin, begin + rows) of w: a view of the same storage (row-major [rows, cols]).
LinearWeight row_slice(const LinearWeight& w, int64_t begin, int64_t rows) {
  LinearWeight slice;
  slice.data = w.data + begin * w.cols;
  slice.rows = rows;
  slice.cols = w.cols;
  slice.storage = w.storage;
  return slice;
}

// Whether w can be split over `ranks`: BF16 data, no INT8 form, rows divisible.
bool splittable(const LinearWeight& w, int ranks) {
  return w.data != nullptr && !w.int8 && w.rows % ranks == 0;
}

// This rank's slice of w, packed when w is (so that linear() picks the same kernel).
Result<LinearWeight> slice_of(const LinearWeight& w, int rank, int ranks) {
  const int64_t part = w.rows / ranks;
  LinearWeight slice = row_slice(w, rank * part, part);
  if (w.bf16_packed) PS_RETURN_IF_ERROR(pack_linear_bf16(slice));
  return slice;
}

// The slices of weights that share an input, or nothing when one of them cannot be split.
Result<std::optional<TensorParallelBackend::ProjectionSlice>> projection_slice(
    std::initializer_list<const LinearWeight*> weights, int rank, int ranks) {
  TensorParallelBackend::ProjectionSlice slice;
  for (const LinearWeight* w : weights) {
    if (!splittable(*w, ranks) || w->cols != (*weights.begin())->cols) {
      return std::optional<TensorParallelBackend::ProjectionSlice>();
    }
  }
  for (const LinearWeight* w : weights) {
    PS_ASSIGN_OR_RETURN(LinearWeight part, slice_of(*w, rank, ranks));
    slice.weights.push_back(std::move(part));
  }
  slice.input_width = (*weights.begin())->cols;
  return std::optional<TensorParallelBackend::ProjectionSlice>(std::move(slice));
}

}  // namespace

Result<std::unique_ptr<TensorParallelBackend>> TensorParallelBackend::create(
    TensorParallelOptions options) {
  if (options.communicator == nullptr) return invalid_argument("tensor parallel: no communicator");
  if (options.max_rows_per_rank < 0) {
    return invalid_argument("tensor parallel: max rows per rank " +
                            std::to_string(options.max_rows_per_rank) + ", expected >= 0");
  }
  const int ranks = options.communicator->size(), rank = options.communicator->rank();
  const int64_t hidden = options.hidden_size;
  std::vector<LayerSlices> slices(options.layers.size());
  for (size_t layer = 0; layer < slices.size() && options.max_rows_per_rank > 0; ++layer) {
    const ReplicatedLayerWeights& weights = options.layers[layer];
    if (const MlpWeights* w = weights.mlp; w != nullptr && !w->gate_up_int8) {
      const int64_t inter = w->gate.rows;
      if (w->gate.cols != hidden || w->up.rows != inter || w->up.cols != hidden ||
          w->down.rows != hidden || w->down.cols != inter) {
        return invalid_argument("tensor parallel: layer " + std::to_string(layer) +
                                ": gate/up/down are not [I, " + std::to_string(hidden) + "], [I, " +
                                std::to_string(hidden) + "], [" + std::to_string(hidden) + ", I]");
      }
      if (splittable(w->gate, ranks) && splittable(w->up, ranks) && splittable(w->down, ranks)) {
        MlpSlice s;
        s.inter = inter / ranks;
        PS_ASSIGN_OR_RETURN(s.mlp.gate, slice_of(w->gate, rank, ranks));
        PS_ASSIGN_OR_RETURN(s.mlp.up, slice_of(w->up, rank, ranks));
        PS_ASSIGN_OR_RETURN(s.mlp.down, slice_of(w->down, rank, ranks));
        slices[layer].mlp = std::move(s);
      }
    }
    if (const AttentionWeights* a = weights.attention; a != nullptr) {
      auto& p = slices[layer].projections;
      const LinearWeight& first = a->q_a ? *a->q_a : *a->q_proj;
      PS_ASSIGN_OR_RETURN(p[static_cast<int>(ReplicatedProjection::kAttentionDown)],
                          projection_slice({&first, &a->kv_a}, rank, ranks));
      if (a->q_b) {
        PS_ASSIGN_OR_RETURN(p[static_cast<int>(ReplicatedProjection::kAttentionQueryUp)],
                            projection_slice({&*a->q_b}, rank, ranks));
      }
      PS_ASSIGN_OR_RETURN(p[static_cast<int>(ReplicatedProjection::kAttentionOutput)],
                          projection_slice({&a->o_proj}, rank, ranks));
    }
  }
  std::optional<ProjectionSlice> head;
  if (options.lm_head != nullptr && options.max_rows_per_rank > 0) {
    PS_ASSIGN_OR_RETURN(head, projection_slice({options.lm_head}, rank, ranks));
  }
  const double max_bytes = options.max_buffer_bytes;
  auto backend = std::make_unique<TensorParallelBackend>(std::move(options), std::move(slices),
                                                         std::move(head));
  if (const double bytes = backend->buffer_bytes(); max_bytes > 0 && bytes > max_bytes) {
    char message[256];
    std::snprintf(message, sizeof message,
                  "tensor parallel: splitting steps of up to %d rows per rank needs %.0f MiB of "
                  "buffers per rank, over the %.0f MiB allowed",
                  backend->options_.max_rows_per_rank, bytes / 1048576.0, max_bytes / 1048576.0);
    return resource_exhausted(message);
  }
  backend->allocate();
  if (backend->split_layers() > 0 || backend->splits_lm_head()) {
    PS_RETURN_IF_ERROR(backend->init_window());
  }
  return backend;
}

TensorParallelBackend::TensorParallelBackend(TensorParallelOptions options,
                                             std::vector<LayerSlices> slices,
                                             std::optional<ProjectionSlice> head)
    : options_(std::move(options)), slices_(std::move(slices)), head_(std::move(head)) {
  ranks_ = options_.communicator->size();
  int64_t max_up = 0;
  if (head_) {
    max_input_ = head_->input_width;
    max_local_ = head_->weights[0].rows;
  }
  const bool balances =
      options_.routed_experts && options_.routed_intermediate > 0 && ranks_ <= kMaxBalancedRanks;
  for (size_t l = 0; l < slices_.size(); ++l) {
    const LayerSlices& layer = slices_[l];
    if (layer.mlp) {
      max_input_ = std::max(max_input_, options_.hidden_size);
      max_local_ = std::max({max_local_, layer.mlp->inter, options_.hidden_size / ranks_});
      max_inter_ = std::max(max_inter_, layer.mlp->inter * ranks_);
      max_up = std::max(max_up, layer.mlp->inter);
      if (balances && options_.layers[l].shared_expert) {
        // A whole shared expert: gate and up over all of I, the output over all of hidden.
        max_up = std::max(max_up, layer.mlp->inter * ranks_);
        max_local_ = std::max(max_local_, options_.hidden_size);
        balances_shared_ = true;
      }
    }
    for (const std::optional<ProjectionSlice>& p : layer.projections) {
      if (!p) continue;
      int64_t width = 0;
      for (const LinearWeight& w : p->weights) width += w.rows;
      max_input_ = std::max(max_input_, p->input_width);
      max_local_ = std::max(max_local_, width);
    }
  }
  max_up_ = max_up;
}

double TensorParallelBackend::buffer_bytes() const {
  if (max_input_ == 0) return 0;  // nothing split: no buffers
  const double cap = options_.max_rows_per_rank, most_rows = cap * ranks_;
  const double row_gather = kLine + 4.0 * cap * max_input_;   // per source, twice
  const double column_gather = 4.0 * most_rows * max_local_;  // per source, twice
  const double window = kBuffers * ranks_ * kLine + 2 * ranks_ * (row_gather + column_gather);
  const double scratch =
      row_gather + 4.0 * most_rows * (max_input_ + max_local_ + max_up_ + max_inter_);
  return window + scratch;
}

void TensorParallelBackend::allocate() {
  if (max_input_ == 0) return;  // nothing split: no buffers
  const int64_t cap = options_.max_rows_per_rank, most_rows = cap * ranks_;
  const size_t rows_bytes = kLine + float_bytes(cap * max_input_);
  buffer_bytes_[0] = buffer_bytes_[1] = round_up(rows_bytes);
  buffer_bytes_[2] = buffer_bytes_[3] = round_up(float_bytes(most_rows * max_local_));
  size_t offset = static_cast<size_t>(kBuffers * ranks_) * kLine;  // the flags
  for (int b = 0; b < kBuffers; ++b) {
    buffer_offset_[b] = offset;
    offset += buffer_bytes_[b] * ranks_;
  }
  send_.resize(rows_bytes);
  counts_.resize(ranks_);
  loads_.resize(ranks_);
  routed_total_.resize(ranks_);
  x_all_.resize(most_rows * max_input_);
  local_.resize(most_rows * max_local_);
  up_.resize(most_rows * max_up_);
  inter_.resize(most_rows * max_inter_);
}

int TensorParallelBackend::split_layers() const {
  int n = 0;
  for (const LayerSlices& layer : slices_) {
    bool any = layer.mlp.has_value();
    for (const std::optional<ProjectionSlice>& p : layer.projections) any = any || p.has_value();
    n += any;
  }
  return n;
}

Status TensorParallelBackend::init_window() {
  const size_t bytes = buffer_offset_[kBuffers - 1] + buffer_bytes_[kBuffers - 1] * ranks_;
  PS_ASSIGN_OR_RETURN(window_, options_.communicator->create_window(bytes, options_.peer_timeout));
  for (int r = 0; r < ranks_; ++r) direct_.push_back(window_->direct(r));
  return ok_status();
}

Status TensorParallelBackend::all_gather(int buffer, uint64_t sequence,
                                         std::span<const std::byte> mine, const char* what) {
  PS_RETURN_IF_ERROR(post_gather(buffer, sequence, mine));
  return wait_gather(buffer, sequence, what);
}

Status TensorParallelBackend::post_gather(int buffer, uint64_t sequence,
                                          std::span<const std::byte> mine) {
  const int me = options_.communicator->rank();
  const size_t place = buffer_offset_[buffer] + buffer_bytes_[buffer] * me;
  const size_t flag = static_cast<size_t>(buffer * ranks_ + me) * kLine;
  for (int r = 0; r < ranks_; ++r) {
    if (!mine.empty()) {
      if (direct_[r] != nullptr) {
        std::memcpy(direct_[r] + place, mine.data(), mine.size());
      } else {
        PS_RETURN_IF_ERROR(window_->put(r, place, mine));
      }
    }
    PS_RETURN_IF_ERROR(window_->signal(r, flag, sequence));
  }
  return ok_status();
}

Status TensorParallelBackend::wait_gather(int buffer, uint64_t sequence, const char* what) {
  const Clock::time_point deadline = Clock::now() + options_.peer_timeout;
  for (int r = 0; r < ranks_; ++r) {
    const size_t from = static_cast<size_t>(buffer * ranks_ + r) * kLine;
    Status status = window_->wait_at_least(from, sequence, r, what, deadline);
    if (!status.ok()) {
      return status.with_context("tensor-parallel gather " + std::to_string(sequence) +
                                 " of buffer " + std::to_string(buffer) + " (timeout " +
                                 std::to_string(options_.peer_timeout.count()) + " ms)");
    }
  }
  return ok_status();
}

const std::byte* TensorParallelBackend::received(int buffer, int source) const {
  return window_->local().data() + buffer_offset_[buffer] + buffer_bytes_[buffer] * source;
}

Result<bool> TensorParallelBackend::gather_rows(const float* x, int64_t rows, int64_t cols,
                                                std::span<const int32_t> loads) {
  const int64_t cap = options_.max_rows_per_rank;
  const uint64_t sequence = ++row_gathers_;
  const int buffer = static_cast<int>(sequence & 1);
  std::memset(send_.data(), 0, kLine);
  std::memcpy(send_.data(), &rows, sizeof rows);
  if (!loads.empty()) {
    PS_CHECK(static_cast<int>(loads.size()) == ranks_ && ranks_ <= kMaxBalancedRanks);
    const int32_t flag = 1;
    std::memcpy(send_.data() + kLoadsFlagAt, &flag, sizeof flag);
    std::memcpy(send_.data() + kLoadsAt, loads.data(), loads.size_bytes());
  }
  size_t send_bytes = kLine;
  if (rows > 0 && rows <= cap) {
    std::memcpy(send_.data() + kLine, x, float_bytes(rows * cols));
    send_bytes += float_bytes(rows * cols);
  }
  PS_RETURN_IF_ERROR(all_gather(buffer, sequence, {send_.data(), send_bytes}, "its rows"));
  bool fits = true;
  total_ = 0;
  routed_known_ = ranks_ <= kMaxBalancedRanks;
  if (routed_known_) std::fill(routed_total_.begin(), routed_total_.end(), 0);
  for (int r = 0; r < ranks_; ++r) {
    std::memcpy(&counts_[r], received(buffer, r), sizeof(int64_t));
    if (counts_[r] < 0) {
      return internal_error("tensor-parallel gather: rank " + std::to_string(r) +
                            " sent a row count of " + std::to_string(counts_[r]));
    }
    int32_t has_loads = 0;
    std::memcpy(&has_loads, received(buffer, r) + kLoadsFlagAt, sizeof has_loads);
    routed_known_ = routed_known_ && has_loads == 1;
    for (int owner = 0; owner < ranks_ && routed_known_; ++owner) {
      int32_t load = 0;
      std::memcpy(&load, received(buffer, r) + kLoadsAt + owner * sizeof(int32_t), sizeof load);
      if (load < 0) {
        return internal_error("tensor-parallel gather: rank " + std::to_string(r) +
                              " sent a routed load of " + std::to_string(load));
      }
      routed_total_[owner] += load;
    }
    fits = fits && counts_[r] <= cap;
    if (r == options_.communicator->rank()) mine_ = total_;
    total_ += counts_[r];
  }
  if (!fits) return false;  // every rank sees the same counts
  int64_t row = 0;
  for (int r = 0; r < ranks_; ++r) {
    std::memcpy(x_all_.data() + row * cols, received(buffer, r) + kLine,
                float_bytes(counts_[r] * cols));
    row += counts_[r];
  }
  return true;
}

Result<int> TensorParallelBackend::gather_columns(const float* local, int64_t width,
                                                  const char* what) {
  const uint64_t sequence = ++column_gathers_;
  const int buffer = 2 + static_cast<int>(sequence & 1);
  const std::span<const float> mine(local, static_cast<size_t>(total_ * width));
  PS_RETURN_IF_ERROR(all_gather(buffer, sequence, std::as_bytes(mine), what));
  return buffer;
}

Result<bool> TensorParallelBackend::run_projection(const ComputeContext& ctx, int64_t layer,
                                                   ReplicatedProjection which, const float* x,
                                                   int64_t rows, std::span<float* const> out) {
  PS_RETURN_IF_ERROR(finish_mlp());
  const std::optional<ProjectionSlice>* chosen = &head_;
  if (which != ReplicatedProjection::kLmHead) {
    if (layer < 0 || layer >= static_cast<int64_t>(slices_.size())) return false;
    chosen = &slices_[layer].projections[static_cast<int>(which)];
  }
  const std::optional<ProjectionSlice>& slice = *chosen;
  if (!slice) return false;
  if (out.size() != slice->weights.size()) {
    return invalid_argument("tensor parallel: projection of layer " + std::to_string(layer) +
                            " has " + std::to_string(slice->weights.size()) + " outputs, got " +
                            std::to_string(out.size()));
  }
  PS_ASSIGN_OR_RETURN(const bool fits, gather_rows(x, rows, slice->input_width));
  if (!fits) return false;
  ++split_calls_;
  if (total_ == 0) return true;

  // This rank's columns of each output, side by side: [T, width].
  int64_t width = 0;
  LinearProblem problems[2];
  const size_t count = slice->weights.size();
  PS_CHECK(count <= 2) << count << " weights share one projection";
  for (size_t j = 0; j < count; ++j) {
    problems[j] = {.x = x_all_.data(),
                   .w = &slice->weights[j],
                   .y = local_.data() + width,
                   .y_stride = 0,
                   .m = total_};
    width += slice->weights[j].rows;
  }
  for (size_t j = 0; j < count; ++j) problems[j].y_stride = width;
  grouped_linear(ctx, std::span<const LinearProblem>(problems, count));
  PS_ASSIGN_OR_RETURN(const int buffer, gather_columns(local_.data(), width, "its columns"));

  int64_t offset = 0;
  for (size_t j = 0; j < count; ++j) {
    const int64_t part = slice->weights[j].rows;
    copy_own_rows(buffer, rows, width, offset, part, out[j]);
    offset += part;
  }
  return true;
}

Result<bool> TensorParallelBackend::run_mlp(const ComputeContext& ctx, int64_t layer,
                                            const float* x, int64_t rows, float* out) {
  PS_RETURN_IF_ERROR(finish_mlp());
  if (layer < 0 || layer >= static_cast<int64_t>(slices_.size()) || !slices_[layer].mlp) {
    return false;
  }
  const MlpSlice& s = *slices_[layer].mlp;
  const int64_t hidden = options_.hidden_size, part = s.inter, inter = part * ranks_;
  const int64_t hidden_part = hidden / ranks_;
  // A rank whose dispatch has no loads for this layer sends none, and then every rank sees
  // routed_known_ false alike.
  const bool shared = balances_shared_ && options_.layers[layer].shared_expert;
  const bool with_loads = shared && options_.routed_experts(layer, loads_);
  PS_ASSIGN_OR_RETURN(const bool fits, gather_rows(x, rows, hidden,
                                                   with_loads ? std::span<const int32_t>(loads_)
                                                              : std::span<const int32_t>()));
  if (!fits) return false;
  ++split_calls_;
  if (total_ == 0) return true;
  if (shared && routed_known_) {
    const MlpWeights& full = *options_.layers[layer].mlp;
    const int whole =
        shared_expert_rank(routed_total_, static_cast<double>(inter) /
                                              static_cast<double>(options_.routed_intermediate));
    if (whole >= 0) {
      ++whole_shared_calls_;
      PS_RETURN_IF_ERROR(run_whole_mlp(ctx, full, whole, rows, out));
      return true;
    }
  }

  // This rank's intermediate columns for every row; gathered, the whole intermediate.
  const LinearProblem gate_up[2] = {
      {.x = x_all_.data(), .w = &s.mlp.gate, .y = local_.data(), .m = total_},
      {.x = x_all_.data(), .w = &s.mlp.up, .y = up_.data(), .m = total_}};
  grouped_bf16_linear(ctx, gate_up);
  kernels::silu_mul(local_.data(), up_.data(), local_.data(), total_ * part);
  PS_ASSIGN_OR_RETURN(const int inter_buffer,
                      gather_columns(local_.data(), part, "its intermediate columns"));
  for (int r = 0; r < ranks_; ++r) {
    const float* block = received_floats(inter_buffer, r);
    for (int64_t t = 0; t < total_; ++t) {
      std::memcpy(inter_.data() + t * inter + r * part, block + t * part, float_bytes(part));
    }
  }

  // This rank's output columns for every row; gathered, each rank keeps its own rows.
  linear(ctx, inter_.data(), total_, s.mlp.down, local_.data());
  PS_ASSIGN_OR_RETURN(const int out_buffer,
                      gather_columns(local_.data(), hidden_part, "its output columns"));
  copy_own_rows(out_buffer, rows, hidden_part, 0, hidden_part, out);
  return true;
}

Status TensorParallelBackend::run_whole_mlp(const ComputeContext& ctx, const MlpWeights& w,
                                            int whole, int64_t rows, float* out) {
  const int64_t hidden = options_.hidden_size;
  const bool mine = options_.communicator->rank() == whole;
  // As the single process runs it (DeepseekModel's run_mlp).
  if (mine) bf16_mlp(ctx, w, x_all_.data(), total_, inter_.data(), up_.data(), local_.data());
  // Posted, not awaited: finish_mlp takes the rows.
  const uint64_t sequence = ++column_gathers_;
  const int buffer = 2 + static_cast<int>(sequence & 1);
  const std::span<const float> block(local_.data(),
                                     static_cast<size_t>(mine ? total_ * hidden : 0));
  PS_RETURN_IF_ERROR(post_gather(buffer, sequence, std::as_bytes(block)));
  pending_ =
      PendingMlp{.buffer = buffer, .sequence = sequence, .whole = whole, .rows = rows, .out = out};
  return ok_status();
}

Status TensorParallelBackend::finish_mlp() {
  if (!pending_) return ok_status();
  const PendingMlp p = *pending_;
  pending_.reset();
  PS_RETURN_IF_ERROR(wait_gather(p.buffer, p.sequence, "the shared expert"));
  const int64_t hidden = options_.hidden_size;
  const float* block = received_floats(p.buffer, p.whole);
  if (p.rows > 0) std::memcpy(p.out, block + mine_ * hidden, float_bytes(p.rows * hidden));
  return ok_status();
}

int TensorParallelBackend::shared_expert_rank(std::span<const int64_t> routed,
                                              double shared_units) {
  if (routed.size() < 2 || shared_units <= 0.0) return -1;
  const auto lightest = std::min_element(routed.begin(), routed.end());
  int64_t heaviest = 0, heaviest_other = 0;
  for (auto it = routed.begin(); it != routed.end(); ++it) {
    heaviest = std::max(heaviest, *it);
    if (it != lightest) heaviest_other = std::max(heaviest_other, *it);
  }
  const double even =
      static_cast<double>(heaviest) + shared_units / static_cast<double>(routed.size());
  const double whole =
      std::max(static_cast<double>(heaviest_other), static_cast<double>(*lightest) + shared_units);
  return whole < even ? static_cast<int>(lightest - routed.begin()) : -1;
}

void TensorParallelBackend::copy_own_rows(int buffer, int64_t rows, int64_t width, int64_t offset,
                                          int64_t part, float* out) const {
  const int64_t full = part * ranks_;
  for (int r = 0; r < ranks_; ++r) {
    const float* block = received_floats(buffer, r);
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(out + i * full + r * part, block + (mine_ + i) * width + offset,
                  float_bytes(part));
    }
  }
}

}  // namespace peerserve::dist
