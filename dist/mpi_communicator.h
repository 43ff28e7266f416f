// Communicator over MPI (Debian's OpenMPI): one rank per process, started by mpirun.
//
// MpiCommunicator::init() calls MPI_Init_thread (MPI_THREAD_SERIALIZED: one thread at a
// time calls MPI, not necessarily the one that initialised it: a server's engine thread
// drives the exchanges after the main thread set them up) and the destructor MPI_Finalize,
// so the object is
// the MPI session. It works on a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so
// MPI failures come back as Status.
//
// Windows are MPI-3 RMA windows opened once for passive target access (MPI_Win_lock_all):
// when every rank is on one node (and MpiWindows::kAuto), MPI_Win_allocate_shared, so
// Window::direct() gives each peer's memory for plain stores; otherwise MPI_Win_allocate
// (osc/ucx, osc/rdma or osc/pt2pt: the network across nodes) and direct() is nullptr; put is
// MPI_Put, flush MPI_Win_flush, signal an MPI_Accumulate (MPI_REPLACE) of one uint64 after a flush,
// and wait_at_least polls the local word with MPI_Win_sync, yielding the core between polls (ranks
// may outnumber cores). Collectives are the non-blocking MPI ones polled against the timeout.
//
// After any error the communicator is broken: windows and the session are then torn down
// without the collective MPI_Win_free / MPI_Finalize (which would wait for the lost rank);
// call abort() to end every process of the job, or return non-zero from main.
//
// Thread-safety: one thread (the one that called init) uses the communicator and its
// windows. Windows must be destroyed before the communicator.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "dist/communicator.h"

namespace peerserve::dist {

// Where windows live. kAuto: shared memory when every rank is on one node, else the MPI
// one-sided transport. kNetwork: the MPI one-sided transport always, so that the path
// across hosts runs (and is tested) on one machine too; mpirun's --mca options pick the
// transport (e.g. "--mca osc pt2pt --mca btl self,tcp": TCP through the kernel).
enum class MpiWindows { kAuto, kNetwork };

Result<MpiWindows> parse_mpi_windows(std::string_view name);  // auto | network

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI (once per process). Fails if MPI was already initialised.
  static Result<std::unique_ptr<MpiCommunicator>> init(int* argc, char*** argv,
                                                       MpiWindows windows = MpiWindows::kAuto);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view name() const override;

  Status barrier(std::chrono::milliseconds timeout) override;
  Status allreduce(std::span<int64_t> values, ReduceOp op,
                   std::chrono::milliseconds timeout) override;
  Status allgather(std::span<const std::byte> mine, std::span<std::byte> all,
                   std::chrono::milliseconds timeout) override;
  Result<std::unique_ptr<Window>> create_window(size_t bytes,
                                                std::chrono::milliseconds timeout) override;

  // Freeing a window meets every rank first; it waits at least `timeout` (default: the
  // window's own timeout). At the end of a job ranks arrive far apart (rank 0 writing its
  // output after the last step), and a rank taken for lost there skips MPI_Finalize, which
  // mpirun answers by killing the job.
  void set_teardown_timeout(std::chrono::milliseconds timeout);

  // True when windows are shared memory (Window::direct gives peers' memory).
  bool shared_memory_windows() const;

  // True after an operation failed (a lost or stuck peer, an MPI error): teardown then
  // skips the collective calls, so returning from main exits without waiting for peers.
  bool broken() const;

  // Ends every process of the job with `exit_code` (MPI_Abort). Print the reason first.
  [[noreturn]] void abort(int exit_code);

  struct Impl;
  explicit MpiCommunicator(std::shared_ptr<Impl> impl);  // use init()

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace peerserve::dist
