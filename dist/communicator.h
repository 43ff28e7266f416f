// The Communicator seam: the ranks of an expert-parallel group, the few collectives the step
// coordinator needs, and one-sided windows for the MoE exchange.
//
// Two implementations: InProcessCommunicator (N ranks as N threads over shared buffers, for
// unit tests) and MpiCommunicator (processes under mpirun, MPI-3 RMA windows: shared memory
// between ranks of one node, the network across nodes).
//
// Every operation that waits on a peer takes a timeout (or deadline) and returns
// Unavailable naming the rank(s) that did not arrive: a dead peer is an error, never a
// hang. After such an error the group is broken; the caller is expected to report and
// exit (MpiCommunicator::abort ends every process of an MPI job).
//
// Thread-safety: a Communicator and its Windows belong to one thread (the rank's engine
// thread). Collectives and window creation are collective: every rank calls them in the
// same order with matching arguments.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "base/status.h"

namespace peerserve::dist {

using Clock = std::chrono::steady_clock;

enum class ReduceOp : uint8_t { kSum, kMax };

// A region of `bytes` bytes on every rank that peers write with put() and signal().
// Flags are aligned uint64 words inside the window that only grow (a step sequence number
// or a count): signal() stores one, wait_at_least() polls the local one.
class Window {
 public:
  virtual ~Window() = default;

  // This rank's part of the window, zero-initialised, 64-byte aligned. Peers' puts land
  // here; read it only after the matching flag has been seen by wait_at_least().
  virtual std::span<std::byte> local() = 0;

  // Copies `bytes` to [offset, offset + bytes.size()) of `target`'s part (target may be
  // this rank). The source may be reused only after flush(target) or signal(target, ...).
  virtual Status put(int target, size_t offset, std::span<const std::byte> bytes) = 0;
  // `target`'s part as memory this rank can store into directly (ranks that share memory:
  // in-process ranks, MPI ranks on one node), or nullptr (then use put). Stores through it
  // follow the same rules as puts: visible to the target after signal(target, ...).
  virtual std::byte* direct(int target) = 0;
  // Returns when every put issued to `target` so far has landed there.
  virtual Status flush(int target) = 0;
  // Completes every earlier put and direct store to `target`, then atomically stores
  // `value` into the 8-byte-aligned uint64 at `offset` of target's part (so a peer that
  // sees the flag sees the data before it).
  virtual Status signal(int target, size_t offset, uint64_t value) = 0;
  // Waits until the local uint64 at `offset` is >= `value`. `from_rank` is the peer expected
  // to write it and `what` names the wait in the error ("dispatch of step 12"): past the
  // deadline the result is Unavailable "rank R did not deliver <what> within T ms".
  virtual Status wait_at_least(size_t offset, uint64_t value, int from_rank, const char* what,
                               Clock::time_point deadline) = 0;
  // One look at the local uint64 at `offset`: whether it is already >= `value` (no wait, no
  // error; false for an offset outside the window). What wait_at_least would return at once.
  virtual bool reached(size_t offset, uint64_t value) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short description for logs ("mpi rank 1 of 4 on host").
  virtual std::string_view name() const = 0;

  // Returns once every rank has entered it, or Unavailable naming the missing ranks.
  virtual Status barrier(std::chrono::milliseconds timeout) = 0;
  // values[i] = op over ranks of values[i], in place. Every rank passes the same length
  // (small: a few counters of the step coordinator).
  virtual Status allreduce(std::span<int64_t> values, ReduceOp op,
                           std::chrono::milliseconds timeout) = 0;
  // all[r * mine.size() .. ] = rank r's `mine`. all.size() == size() * mine.size().
  virtual Status allgather(std::span<const std::byte> mine, std::span<std::byte> all,
                           std::chrono::milliseconds timeout) = 0;
  // Collective: a window of `bytes` bytes on every rank (same size everywhere).
  virtual Result<std::unique_ptr<Window>> create_window(size_t bytes,
                                                        std::chrono::milliseconds timeout) = 0;
};

}  // namespace peerserve::dist
