#include "dist/in_process_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"

namespace peerserve::dist {
namespace {

constexpr size_t kAlignment = 64;

// One rank's part of a window: zeroed, 64-byte aligned.
class RankBuffer {
 public:
  explicit RankBuffer(size_t bytes)
      : storage_(std::make_unique<std::byte[]>(bytes + kAlignment)), bytes_(bytes) {
    void* p = storage_.get();
    size_t space = bytes + kAlignment;
    data_ = static_cast<std::byte*>(std::align(kAlignment, bytes, p, space));
    std::memset(data_, 0, bytes);
  }
  std::byte* data() { return data_; }
  size_t size() const { return bytes_; }

 private:
  std::unique_ptr<std::byte[]> storage_;
  std::byte* data_ = nullptr;
  size_t bytes_;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

struct InProcessGroup::State {
  explicit State(int n) : size(n), deposits(n), deposited(n, false) {}

  // Fails every pending and later operation with `status` (first error wins). Called with
  // `mutex` held; broken_status is written before `broken` is published and never again.
  void break_group(const Status& status) {
    if (!broken.load()) {
      broken_status = status;
      broken.store(true, std::memory_order_release);
    }
    changed.notify_all();
  }
  Status broken_error() const { return broken_status; }

  // Rank `rank` contributes `mine`; returns every rank's contribution once all arrived.
  Result<std::vector<std::vector<std::byte>>> rendezvous(int rank, std::span<const std::byte> mine,
                                                         const char* what,
                                                         std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    if (broken) return broken_error();
    const uint64_t my_generation = generation;
    deposits[rank].assign(mine.begin(), mine.end());
    deposited[rank] = true;
    if (++arrived == size) {
      results[my_generation & 1] = deposits;
      std::fill(deposited.begin(), deposited.end(), false);
      arrived = 0;
      ++generation;
      changed.notify_all();
    } else {
      const bool done = changed.wait_for(
          lock, timeout, [&] { return generation != my_generation || broken.load(); });
      if (!done) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r) {
          if (!deposited[r]) missing.push_back(r);
        }
        break_group(unavailable(std::string(what) + ": rank" + (missing.size() > 1 ? "s " : " ") +
                                join_ranks(missing) + " did not arrive within " +
                                std::to_string(timeout.count()) + " ms"));
      }
      if (generation == my_generation) return broken_error();
    }
    return results[my_generation & 1];
  }

  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<bool> broken{false};
  Status broken_status;  // valid once `broken` is true
  std::vector<std::vector<std::byte>> deposits;
  std::vector<bool> deposited;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<std::vector<std::byte>> results[2];
  // Window buffers being exchanged by create_window, by creation index.
  std::vector<std::vector<std::shared_ptr<RankBuffer>>> window_buffers;
};

namespace {

class InProcessWindow final : public Window {
 public:
  InProcessWindow(std::shared_ptr<InProcessGroup::State> state, int rank,
                  std::vector<std::shared_ptr<RankBuffer>> buffers)
      : state_(std::move(state)), rank_(rank), buffers_(std::move(buffers)) {}

  std::span<std::byte> local() override {
    return {buffers_[rank_]->data(), buffers_[rank_]->size()};
  }

  Status put(int target, size_t offset, std::span<const std::byte> bytes) override {
    PS_RETURN_IF_ERROR(check_range(target, offset, bytes.size(), "put"));
    if (!bytes.empty()) std::memcpy(buffers_[target]->data() + offset, bytes.data(), bytes.size());
    return ok_status();
  }

  std::byte* direct(int target) override {
    return target >= 0 && target < static_cast<int>(buffers_.size()) ? buffers_[target]->data()
                                                                     : nullptr;
  }

  Status flush(int target) override { return check_range(target, 0, 0, "flush"); }

  Status signal(int target, size_t offset, uint64_t value) override {
    PS_RETURN_IF_ERROR(check_flag(target, offset, "signal"));
    flag(target, offset).store(value, std::memory_order_release);
    return ok_status();
  }

  Status wait_at_least(size_t offset, uint64_t value, int from_rank, const char* what,
                       Clock::time_point deadline) override {
    PS_RETURN_IF_ERROR(check_flag(rank_, offset, "wait"));
    std::atomic_ref<uint64_t> word = flag(rank_, offset);
    for (int spin = 0;; ++spin) {
      if (word.load(std::memory_order_acquire) >= value) return ok_status();
      if (spin < 64) continue;
      if (state_->broken) return state_->broken_error();
      if (Clock::now() > deadline) {
        Status error = unavailable("rank " + std::to_string(from_rank) + " did not deliver " +
                                   what + " to rank " + std::to_string(rank_) + " in time");
        std::lock_guard lock(state_->mutex);
        state_->break_group(error);
        return error;
      }
      std::this_thread::yield();
    }
  }

  bool reached(size_t offset, uint64_t value) override {
    if (!check_flag(rank_, offset, "poll").ok()) return false;
    return flag(rank_, offset).load(std::memory_order_acquire) >= value;
  }

 private:
  std::atomic_ref<uint64_t> flag(int target, size_t offset) {
    return std::atomic_ref<uint64_t>(
        *reinterpret_cast<uint64_t*>(buffers_[target]->data() + offset));
  }
  Status check_range(int target, size_t offset, size_t bytes, const char* op) const {
    if (target < 0 || target >= static_cast<int>(buffers_.size())) {
      return invalid_argument(std::string("window ") + op + ": rank " + std::to_string(target) +
                              " outside [0, " + std::to_string(buffers_.size()) + ")");
    }
    if (offset > buffers_[target]->size() || bytes > buffers_[target]->size() - offset) {
      return invalid_argument(std::string("window ") + op + ": bytes [" + std::to_string(offset) +
                              ", " + std::to_string(offset + bytes) + ") outside the window of " +
                              std::to_string(buffers_[target]->size()) + " bytes");
    }
    return ok_status();
  }
  Status check_flag(int target, size_t offset, const char* op) const {
    PS_RETURN_IF_ERROR(check_range(target, offset, sizeof(uint64_t), op));
    if (offset % alignof(uint64_t) != 0) {
      return invalid_argument(std::string("window ") + op + ": flag offset " +
                              std::to_string(offset) + " is not 8-byte aligned");
    }
    return ok_status();
  }

  std::shared_ptr<InProcessGroup::State> state_;
  int rank_;
  std::vector<std::shared_ptr<RankBuffer>> buffers_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> state, int rank)
      : state_(std::move(state)),
        rank_(rank),
        name_("in-process rank " + std::to_string(rank) + " of " + std::to_string(state_->size)) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string_view name() const override { return name_; }

  Status barrier(std::chrono::milliseconds timeout) override {
    return state_->rendezvous(rank_, {}, "barrier", timeout).status();
  }

  Status allreduce(std::span<int64_t> values, ReduceOp op,
                   std::chrono::milliseconds timeout) override {
    PS_ASSIGN_OR_RETURN(auto all,
                        state_->rendezvous(rank_, std::as_bytes(values), "allreduce", timeout));
    std::vector<int64_t> contribution(values.size());
    for (int r = 0; r < size(); ++r) {
      if (all[r].size() != values.size_bytes()) {
        return invalid_argument("allreduce: rank " + std::to_string(r) + " passed " +
                                std::to_string(all[r].size() / sizeof(int64_t)) + " values, rank " +
                                std::to_string(rank_) + " passed " + std::to_string(values.size()));
      }
      std::memcpy(contribution.data(), all[r].data(), all[r].size());
      for (size_t i = 0; i < values.size(); ++i) {
        if (r == 0) {
          values[i] = contribution[i];
        } else {
          values[i] = op == ReduceOp::kSum ? values[i] + contribution[i]
                                           : std::max(values[i], contribution[i]);
        }
      }
    }
    return ok_status();
  }

  Status allgather(std::span<const std::byte> mine, std::span<std::byte> all,
                   std::chrono::milliseconds timeout) override {
    if (all.size() != mine.size() * size()) {
      return invalid_argument("allgather: output of " + std::to_string(all.size()) +
                              " bytes, expected " + std::to_string(size()) + " x " +
                              std::to_string(mine.size()));
    }
    PS_ASSIGN_OR_RETURN(auto parts, state_->rendezvous(rank_, mine, "allgather", timeout));
    for (int r = 0; r < size(); ++r) {
      if (parts[r].size() != mine.size()) {
        return invalid_argument("allgather: rank " + std::to_string(r) + " passed " +
                                std::to_string(parts[r].size()) + " bytes, expected " +
                                std::to_string(mine.size()));
      }
      std::memcpy(all.data() + r * mine.size(), parts[r].data(), mine.size());
    }
    return ok_status();
  }

  Result<std::unique_ptr<Window>> create_window(size_t bytes,
                                                std::chrono::milliseconds timeout) override {
    const size_t index = windows_created_++;
    auto buffer = std::make_shared<RankBuffer>(bytes);
    {
      std::lock_guard lock(state_->mutex);
      if (state_->window_buffers.size() <= index) {
        state_->window_buffers.resize(index + 1, std::vector<std::shared_ptr<RankBuffer>>(size()));
      }
      state_->window_buffers[index][rank_] = buffer;
    }
    const uint64_t size_bytes = bytes;
    PS_ASSIGN_OR_RETURN(auto sizes,
                        state_->rendezvous(rank_, std::as_bytes(std::span(&size_bytes, 1)),
                                           "create_window", timeout));
    for (int r = 0; r < size(); ++r) {
      uint64_t theirs = 0;
      std::memcpy(&theirs, sizes[r].data(), sizeof theirs);
      if (theirs != size_bytes) {
        return invalid_argument("create_window: rank " + std::to_string(r) + " asked for " +
                                std::to_string(theirs) + " bytes, rank " + std::to_string(rank_) +
                                " for " + std::to_string(size_bytes));
      }
    }
    std::vector<std::shared_ptr<RankBuffer>> buffers;
    {
      std::lock_guard lock(state_->mutex);
      buffers = state_->window_buffers[index];
    }
    // Nobody reads the registry entry after the next rendezvous; a later window reuses
    // nothing of it, so it can simply stay (a few pointers per window).
    return std::unique_ptr<Window>(
        std::make_unique<InProcessWindow>(state_, rank_, std::move(buffers)));
  }

 private:
  std::shared_ptr<InProcessGroup::State> state_;
  int rank_;
  std::string name_;
  size_t windows_created_ = 0;
};

}  // namespace

InProcessGroup::InProcessGroup(int size) : state_(std::make_shared<State>(size)) {
  PS_CHECK(size >= 1) << "in-process group of " << size << " ranks";
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const {
  return state_->size;
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  PS_CHECK(rank >= 0 && rank < state_->size) << "rank " << rank << " of " << state_->size;
  return std::make_unique<InProcessCommunicator>(state_, rank);
}

}  // namespace peerserve::dist
