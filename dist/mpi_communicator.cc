#include "dist/mpi_communicator.h"

#include "dist/call_watchdog.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peerserve::dist {
namespace {

// Polls before the first yield: a peer on another core usually answers within a few
// microseconds; on an oversubscribed machine yielding at once lets it run.
constexpr int kSpinsBeforeYield = 32;

// Added to a failed MPI_Win_allocate of a window reached by puts (the path across hosts).
constexpr const char* kNetworkWindowHint =
    "across hosts without RDMA start mpirun with --mca osc ucx or --mca osc pt2pt";

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

}  // namespace

struct MpiCommunicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::string name;
  bool broken = false;
  Status broken_status;  // the first failure, once broken
  // Every rank on one node and MpiWindows::kAuto: windows are MPI_Win_allocate_shared.
  bool shared_windows = false;
  // Bounds the window calls that take no timeout (a flush to a dead peer can block forever).
  std::unique_ptr<CallWatchdog> watchdog;
  // How long freeing a window waits for the other ranks at least (set_teardown_timeout).
  std::chrono::milliseconds teardown_timeout{0};

  // Records the failure; every later teardown skips the collective MPI calls.
  Status fail(Status status) {
    if (!broken) broken_status = status;
    broken = true;
    return status;
  }
  // `what` names the call; `peer` (if >= 0) its target. The message is built only on
  // failure: the step path must not allocate.
  Status check(int code, const char* what, int peer = -1) {
    if (code == MPI_SUCCESS) return ok_status();
    return fail(unavailable(std::string(what) +
                            (peer >= 0 ? " (rank " + std::to_string(peer) + ")" : "") + ": " +
                            mpi_error_text(code)));
  }
  // Polls a non-blocking collective until it completes or the timeout passes.
  Status wait_request(MPI_Request& request, const char* what, std::chrono::milliseconds timeout) {
    const Clock::time_point start = Clock::now(), deadline = start + timeout;
    for (int spin = 0;; ++spin) {
      int done = 0;
      PS_RETURN_IF_ERROR(check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what));
      if (done) return ok_status();
      if (spin < kSpinsBeforeYield) continue;
      const Clock::time_point now = Clock::now();
      if (!arrivals_flushed && now > start + kArrivalsFlushAfter) {
        PS_RETURN_IF_ERROR(flush_arrivals(timeout));
      }
      if (now > deadline) {
        const std::string missing = missing_ranks();
        if (!missing.empty()) {
          const bool one = missing.rfind("rank ", 0) == 0;
          return fail(unavailable(missing + " did not deliver " + (one ? "its" : "their") +
                                  " part of " + what + " to rank " + std::to_string(rank) +
                                  " within " + std::to_string(timeout.count()) + " ms (lost?)"));
        }
        const std::string waited =
            std::to_string(timeout.count()) + " ms (rank " + std::to_string(rank) + " waited";
        if (arrivals_win == MPI_WIN_NULL || entered == 0) {
          return fail(unavailable(std::string(what) + ": not every one of the " +
                                  std::to_string(size) + " ranks arrived within " + waited + ")"));
        }
        // Every count arrived, so each peer entered the collective and a part is stuck on
        // the way: a peer lost after entering, or the network to it cut. (A round trip to
        // each peer does not tell which: over osc/ucx a get from a host cut off completed.)
        return fail(unavailable(std::string(what) + ": every one of the " + std::to_string(size) +
                                " ranks entered it, but not every part arrived within " + waited +
                                "; a rank lost or the network cut?)"));
      }
      sched_yield();
    }
  }

  // Arrival counters. A non-blocking collective that times out cannot say who is missing,
  // so before each one a rank stores how many collectives it has entered into its slot of
  // every peer's arrivals window; on a timeout the slots behind this rank's count name the
  // ranks that never came. The window is made at the first collective (every rank makes
  // the same calls in the same order).
  MPI_Win arrivals_win = MPI_WIN_NULL;
  uint64_t* arrivals = nullptr;            // slot r: collectives rank r entered
  std::vector<uint64_t*> arrivals_direct;  // shared memory: every rank's slots
  uint64_t entered = 0;
  uint64_t entered_sent = 0;  // the origin buffer of the puts (network windows)
  // Network windows: a put may wait at its origin until flushed, so a collective that is
  // slow to complete flushes this rank's count once (not on the fast path: a round trip
  // per peer). A flush to a lost peer blocks; the watchdog then names that peer.
  static constexpr std::chrono::milliseconds kArrivalsFlushAfter{10};
  bool arrivals_flushed = true;

  Status flush_arrivals(std::chrono::milliseconds timeout) {
    arrivals_flushed = true;
    if (shared_windows || arrivals_win == MPI_WIN_NULL || entered == 0) return ok_status();
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const CallWatchdog::Guard guard = watchdog->guard("MPI_Win_flush (arrivals)", r, timeout);
      PS_RETURN_IF_ERROR(check(MPI_Win_flush(r, arrivals_win), "MPI_Win_flush (arrivals)", r));
    }
    return ok_status();
  }

  Status open_arrivals(std::chrono::milliseconds timeout) {
    if (arrivals_win != MPI_WIN_NULL) return ok_status();
    MPI_Request request;
    PS_RETURN_IF_ERROR(check(MPI_Ibarrier(comm, &request), "MPI_Ibarrier"));
    PS_RETURN_IF_ERROR(wait_request(request, "barrier", timeout));
    void* base = nullptr;
    const MPI_Aint bytes = static_cast<MPI_Aint>(size * sizeof(uint64_t));
    constexpr int kUnit = sizeof(uint64_t);
    Status allocated =
        check(shared_windows
                  ? MPI_Win_allocate_shared(bytes, kUnit, MPI_INFO_NULL, comm, &base, &arrivals_win)
                  : MPI_Win_allocate(bytes, kUnit, MPI_INFO_NULL, comm, &base, &arrivals_win),
              "MPI_Win_allocate (arrivals)");
    if (!allocated.ok()) {
      return shared_windows ? allocated : allocated.with_context(kNetworkWindowHint);
    }
    MPI_Win_set_errhandler(arrivals_win, MPI_ERRORS_RETURN);
    arrivals = static_cast<uint64_t*>(base);
    std::fill(arrivals, arrivals + size, 0);
    if (shared_windows) {
      for (int r = 0; r < size; ++r) {
        MPI_Aint peer_bytes = 0;
        int unit = 0;
        void* peer = nullptr;
        PS_RETURN_IF_ERROR(check(MPI_Win_shared_query(arrivals_win, r, &peer_bytes, &unit, &peer),
                                 "MPI_Win_shared_query (arrivals)"));
        arrivals_direct.push_back(static_cast<uint64_t*>(peer));
      }
    }
    PS_RETURN_IF_ERROR(
        check(MPI_Win_lock_all(MPI_MODE_NOCHECK, arrivals_win), "MPI_Win_lock_all (arrivals)"));
    // Nobody stores before every rank has zeroed its slots.
    PS_RETURN_IF_ERROR(check(MPI_Ibarrier(comm, &request), "MPI_Ibarrier"));
    return wait_request(request, "barrier", timeout);
  }

  // Called on entering a collective: this rank's count, into its slot at every peer.
  Status announce(std::chrono::milliseconds timeout) {
    // A collective that failed may still be pending inside MPI, over buffers its caller has
    // since freed: no further call may drive MPI's progress and complete it.
    if (broken) return unavailable("the group is broken: " + broken_status.message());
    PS_RETURN_IF_ERROR(open_arrivals(timeout));
    ++entered;
    if (shared_windows) {
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        std::atomic_ref<uint64_t>(arrivals_direct[r][rank])
            .store(entered, std::memory_order_release);
      }
      return ok_status();
    }
    for (int r = 0; r < size && entered > 1; ++r) {
      // The previous collective's puts read entered_sent: complete them before it changes.
      if (r == rank) continue;
      const CallWatchdog::Guard guard =
          watchdog->guard("MPI_Win_flush_local (arrivals)", r, timeout);
      PS_RETURN_IF_ERROR(
          check(MPI_Win_flush_local(r, arrivals_win), "MPI_Win_flush_local (arrivals)", r));
    }
    entered_sent = entered;
    arrivals_flushed = false;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const CallWatchdog::Guard guard = watchdog->guard("MPI_Put (arrivals)", r, timeout);
      PS_RETURN_IF_ERROR(
          check(MPI_Put(&entered_sent, 1, MPI_UINT64_T, r, rank, 1, MPI_UINT64_T, arrivals_win),
                "MPI_Put (arrivals)", r));
    }
    return ok_status();
  }

  // "rank 2" or "ranks 1 and 3": the peers whose count is behind this rank's; empty when
  // none is (or nothing is known).
  std::string missing_ranks() {
    if (arrivals_win == MPI_WIN_NULL || entered == 0) return "";
    if (MPI_Win_sync(arrivals_win) != MPI_SUCCESS) return "";
    std::vector<int> behind;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      if (std::atomic_ref<uint64_t>(arrivals[r]).load(std::memory_order_acquire) < entered) {
        behind.push_back(r);
      }
    }
    if (behind.empty()) return "";
    std::string list = behind.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < behind.size(); ++i) {
      if (i > 0) list += i + 1 == behind.size() ? " and " : ", ";
      list += std::to_string(behind[i]);
    }
    return list;
  }
};

namespace {

class MpiWindow final : public Window {
 public:
  // `base` and `direct` (a pointer per rank for a shared-memory window, or empty) are the
  // 64-byte-aligned starts of the parts; `pads[r]` is where rank r's aligned start lies in
  // its MPI part (the displacement added to every put and flag). A put, flush or flag to a
  // peer that does not complete within `timeout` ends the process (CallWatchdog).
  MpiWindow(std::shared_ptr<MpiCommunicator::Impl> comm, MPI_Win win, std::byte* base, size_t bytes,
            std::vector<std::byte*> direct, std::vector<uint64_t> pads,
            std::chrono::milliseconds timeout)
      : comm_(std::move(comm)),
        win_(win),
        base_(base),
        bytes_(bytes),
        direct_(std::move(direct)),
        pads_(std::move(pads)),
        timeout_(timeout) {}

  ~MpiWindow() override {
    if (comm_->broken) return;  // MPI_Win_free is collective: a lost peer would hang it
    // It takes no timeout either (a window is freed at every EPLB swap, not only at the
    // end): meet first, with one; a peer that does not come leaves the window to the OS.
    MPI_Request request;
    if (!comm_->check(MPI_Ibarrier(comm_->comm, &request), "MPI_Ibarrier").ok() ||
        !comm_
             ->wait_request(request, "barrier before freeing a window",
                            std::max(timeout_, comm_->teardown_timeout))
             .ok()) {
      return;
    }
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }

  std::span<std::byte> local() override { return {base_, bytes_}; }

  Status put(int target, size_t offset, std::span<const std::byte> bytes) override {
    PS_RETURN_IF_ERROR(check_range(target, offset, bytes.size(), "put"));
    size_t done = 0;
    while (done < bytes.size()) {
      const int chunk = static_cast<int>(std::min<size_t>(bytes.size() - done, INT_MAX / 2));
      const CallWatchdog::Guard guard = comm_->watchdog->guard("MPI_Put", target, timeout_);
      PS_RETURN_IF_ERROR(comm_->check(
          MPI_Put(bytes.data() + done, chunk, MPI_BYTE, target,
                  static_cast<MPI_Aint>(pads_[target] + offset + done), chunk, MPI_BYTE, win_),
          "MPI_Put", target));
      done += chunk;
    }
    return ok_status();
  }

  std::byte* direct(int target) override {
    return target >= 0 && target < static_cast<int>(direct_.size()) ? direct_[target] : nullptr;
  }

  Status flush(int target) override {
    PS_RETURN_IF_ERROR(check_range(target, 0, 0, "flush"));
    const CallWatchdog::Guard guard = comm_->watchdog->guard("MPI_Win_flush", target, timeout_);
    return comm_->check(MPI_Win_flush(target, win_), "MPI_Win_flush", target);
  }

  Status signal(int target, size_t offset, uint64_t value) override {
    PS_RETURN_IF_ERROR(check_range(target, offset, sizeof value, "signal"));
    if (offset % alignof(uint64_t) != 0) {
      return invalid_argument("window signal: flag offset " + std::to_string(offset) +
                              " is not 8-byte aligned");
    }
    PS_RETURN_IF_ERROR(flush(target));  // the data before the flag
    // Orders direct stores (shared memory) before the flag, like the flush orders puts.
    PS_RETURN_IF_ERROR(comm_->check(MPI_Win_sync(win_), "MPI_Win_sync"));
    {
      const CallWatchdog::Guard guard =
          comm_->watchdog->guard("MPI_Accumulate (flag)", target, timeout_);
      PS_RETURN_IF_ERROR(comm_->check(MPI_Accumulate(&value, 1, MPI_UINT64_T, target,
                                                     static_cast<MPI_Aint>(pads_[target] + offset),
                                                     1, MPI_UINT64_T, MPI_REPLACE, win_),
                                      "MPI_Accumulate (flag)", target));
    }
    return flush(target);  // `value` is a local: complete before returning
  }

  Status wait_at_least(size_t offset, uint64_t value, int from_rank, const char* what,
                       Clock::time_point deadline) override {
    PS_RETURN_IF_ERROR(check_range(comm_->rank, offset, sizeof value, "wait"));
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(base_ + offset));
    for (int spin = 0;; ++spin) {
      // Makes the public copy (peers' puts) visible to our loads (MPI-3 §11.7).
      PS_RETURN_IF_ERROR(comm_->check(MPI_Win_sync(win_), "MPI_Win_sync"));
      if (word.load(std::memory_order_acquire) >= value) return ok_status();
      if (spin < kSpinsBeforeYield) continue;
      if ((spin & 15) == 0) {
        if (Clock::now() > deadline) {
          return comm_->fail(unavailable("rank " + std::to_string(from_rank) + " did not deliver " +
                                         what + " to rank " + std::to_string(comm_->rank) +
                                         " in time (lost?)"));
        }
        int pending = 0;  // drives MPI progress for transports that need the target's help
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_->comm, &pending, MPI_STATUS_IGNORE);
      }
      sched_yield();
    }
  }

  bool reached(size_t offset, uint64_t value) override {
    if (!check_range(comm_->rank, offset, sizeof value, "poll").ok()) return false;
    // Makes the public copy (peers' puts) visible to our loads, as wait_at_least does.
    if (MPI_Win_sync(win_) != MPI_SUCCESS) return false;
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(base_ + offset));
    return word.load(std::memory_order_acquire) >= value;
  }

 private:
  Status check_range(int target, size_t offset, size_t bytes, const char* op) const {
    if (target < 0 || target >= comm_->size) {
      return invalid_argument(std::string("window ") + op + ": rank " + std::to_string(target) +
                              " outside [0, " + std::to_string(comm_->size) + ")");
    }
    if (offset > bytes_ || bytes > bytes_ - offset) {
      return invalid_argument(std::string("window ") + op + ": bytes [" + std::to_string(offset) +
                              ", " + std::to_string(offset + bytes) + ") outside the window of " +
                              std::to_string(bytes_) + " bytes");
    }
    return ok_status();
  }

  std::shared_ptr<MpiCommunicator::Impl> comm_;
  MPI_Win win_;
  std::byte* base_;
  size_t bytes_;
  std::vector<std::byte*> direct_;
  std::vector<uint64_t> pads_;  // per rank
  std::chrono::milliseconds timeout_;
};

}  // namespace

Result<MpiWindows> parse_mpi_windows(std::string_view name) {
  if (name == "auto") return MpiWindows::kAuto;
  if (name == "network") return MpiWindows::kNetwork;
  return invalid_argument("unknown window transport '" + std::string(name) +
                          "' (expected auto or network)");
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::init(int* argc, char*** argv,
                                                               MpiWindows windows) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return internal_error("MPI is already initialised in this process");
  // Open MPI's osc/rdma (priority 101) takes the windows of a job across hosts even where the
  // network has no RDMA, and then MPI_Win_allocate fails ("invalid window") over TCP;
  // osc/ucx and osc/pt2pt work there. Leave it out unless the user chose (mpirun --mca osc).
  setenv("OMPI_MCA_osc", "^rdma", /*overwrite=*/0);
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    return unavailable("MPI_Init_thread failed (is this process started by mpirun?)");
  }
  auto impl = std::make_shared<Impl>();
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return unimplemented("this MPI library does not provide MPI_THREAD_SERIALIZED");
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm);
  MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(impl->comm, &impl->rank);
  MPI_Comm_size(impl->comm, &impl->size);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(impl->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    impl->shared_windows = node_size == impl->size && windows == MpiWindows::kAuto;
    MPI_Comm_free(&node);
  }
  char host[MPI_MAX_PROCESSOR_NAME];
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  impl->watchdog = std::make_unique<CallWatchdog>("rank " + std::to_string(impl->rank));
  impl->name = "mpi rank " + std::to_string(impl->rank) + " of " + std::to_string(impl->size) +
               " on " + std::string(host, host_length);
  return std::make_unique<MpiCommunicator>(std::move(impl));
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

MpiCommunicator::~MpiCommunicator() {
  if (impl_->broken) return;  // MPI_Finalize would wait for the lost rank
  if (impl_->arrivals_win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(impl_->arrivals_win);
    MPI_Win_free(&impl_->arrivals_win);
  }
  MPI_Comm_free(&impl_->comm);
  MPI_Finalize();
}

int MpiCommunicator::rank() const {
  return impl_->rank;
}
int MpiCommunicator::size() const {
  return impl_->size;
}
bool MpiCommunicator::shared_memory_windows() const {
  return impl_->shared_windows;
}
bool MpiCommunicator::broken() const {
  return impl_->broken;
}
std::string_view MpiCommunicator::name() const {
  return impl_->name;
}

Status MpiCommunicator::barrier(std::chrono::milliseconds timeout) {
  PS_RETURN_IF_ERROR(impl_->announce(timeout));
  MPI_Request request;
  PS_RETURN_IF_ERROR(impl_->check(MPI_Ibarrier(impl_->comm, &request), "MPI_Ibarrier"));
  return impl_->wait_request(request, "barrier", timeout);
}

Status MpiCommunicator::allreduce(std::span<int64_t> values, ReduceOp op,
                                  std::chrono::milliseconds timeout) {
  PS_RETURN_IF_ERROR(impl_->announce(timeout));
  MPI_Request request;
  PS_RETURN_IF_ERROR(impl_->check(
      MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T,
                     op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, impl_->comm, &request),
      "MPI_Iallreduce"));
  return impl_->wait_request(request, "allreduce", timeout);
}

Status MpiCommunicator::allgather(std::span<const std::byte> mine, std::span<std::byte> all,
                                  std::chrono::milliseconds timeout) {
  if (all.size() != mine.size() * impl_->size) {
    return invalid_argument("allgather: output of " + std::to_string(all.size()) +
                            " bytes, expected " + std::to_string(impl_->size) + " x " +
                            std::to_string(mine.size()));
  }
  PS_RETURN_IF_ERROR(impl_->announce(timeout));
  MPI_Request request;
  const int count = static_cast<int>(mine.size());
  PS_RETURN_IF_ERROR(impl_->check(MPI_Iallgather(mine.data(), count, MPI_BYTE, all.data(), count,
                                                 MPI_BYTE, impl_->comm, &request),
                                  "MPI_Iallgather"));
  return impl_->wait_request(request, "allgather", timeout);
}

void MpiCommunicator::set_teardown_timeout(std::chrono::milliseconds timeout) {
  impl_->teardown_timeout = timeout;
}

Result<std::unique_ptr<Window>> MpiCommunicator::create_window(size_t bytes,
                                                               std::chrono::milliseconds timeout) {
  // MPI_Win_allocate blocks until every rank calls it: meet first, with a timeout, and
  // compare sizes (each rank allocates its own part, and the exchanges store into a peer's
  // part as if it were their own size: ranks started with other options must not pair).
  const uint64_t mine = bytes;
  std::vector<uint64_t> sizes(static_cast<size_t>(impl_->size));
  PS_RETURN_IF_ERROR(allgather(std::as_bytes(std::span(&mine, 1)),
                               std::as_writable_bytes(std::span(sizes)), timeout));
  for (int r = 0; r < impl_->size; ++r) {
    if (sizes[r] != mine) {
      return invalid_argument("window of " + std::to_string(mine) + " bytes on rank " +
                              std::to_string(impl_->rank) + ", " + std::to_string(sizes[r]) +
                              " on rank " + std::to_string(r) +
                              " (were the ranks started with different options?)");
    }
  }
  void* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  // MPI aligns a part as it likes (Open MPI's shared parts lie back to back, 8 bytes off a
  // cache line here), and a store that straddles two lines costs both: each part is
  // allocated one line longer and used from its first 64-byte boundary.
  constexpr size_t kAlign = 64;
  const size_t allocated_bytes = bytes + kAlign;
  // Shared windows (one node, MpiWindows::kAuto): memory every rank can also store into.
  Status allocated = impl_->check(
      impl_->shared_windows ? MPI_Win_allocate_shared(static_cast<MPI_Aint>(allocated_bytes), 1,
                                                      MPI_INFO_NULL, impl_->comm, &base, &win)
                            : MPI_Win_allocate(static_cast<MPI_Aint>(allocated_bytes), 1,
                                               MPI_INFO_NULL, impl_->comm, &base, &win),
      "MPI_Win_allocate");
  if (!allocated.ok()) {
    return allocated.with_context(
        std::to_string(bytes) + "-byte window" +
        (impl_->shared_windows ? "" : std::string(", ") + kNetworkWindowHint));
  }
  MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
  auto pad_of = [](const void* p) {
    return static_cast<uint64_t>((kAlign - reinterpret_cast<uintptr_t>(p) % kAlign) % kAlign);
  };
  const uint64_t my_pad = pad_of(base);
  std::byte* aligned_base = static_cast<std::byte*>(base) + my_pad;
  std::memset(aligned_base, 0, bytes);
  // Every rank's line offset: puts and flags to rank r land pads[r] bytes into its part.
  // (On an error below the window is left to the OS, as MPI_Win_free would wait for a
  // lost peer.)
  std::vector<uint64_t> pads(static_cast<size_t>(impl_->size));
  PS_RETURN_IF_ERROR(allgather(std::as_bytes(std::span(&my_pad, 1)),
                               std::as_writable_bytes(std::span(pads)), timeout));
  std::vector<std::byte*> direct;
  if (impl_->shared_windows) {
    for (int r = 0; r < impl_->size; ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      void* peer = nullptr;
      PS_RETURN_IF_ERROR(
          impl_->check(MPI_Win_shared_query(win, r, &size, &unit, &peer), "MPI_Win_shared_query"));
      // The owner's aligned start (parts map page-aligned, so it is aligned here too).
      direct.push_back(static_cast<std::byte*>(peer) + pads[r]);
    }
  }
  PS_RETURN_IF_ERROR(impl_->check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win), "MPI_Win_lock_all"));
  auto window = std::make_unique<MpiWindow>(impl_, win, aligned_base, bytes, std::move(direct),
                                            std::move(pads), timeout);
  // Nobody may put before every rank has zeroed its part.
  PS_RETURN_IF_ERROR(barrier(timeout));
  return std::unique_ptr<Window>(std::move(window));
}

void MpiCommunicator::abort(int exit_code) {
  impl_->broken = true;
  MPI_Abort(impl_->comm == MPI_COMM_NULL ? MPI_COMM_WORLD : impl_->comm, exit_code);
  std::_Exit(exit_code);
}

}  // namespace peerserve::dist
