// Communicator for N ranks that are N threads of one process (unit tests, and a way to
// run the expert-parallel path without MPI).
//
// An InProcessGroup holds the shared state: a rendezvous for collectives (mutex +
// condition variable, each rank deposits its contribution and waits for the rest) and the
// windows' buffers, one heap buffer per rank, kept alive by every rank's Window so that a
// rank that leaves early cannot pull memory from under a peer. direct() gives every peer's
// buffer, put() is a memcpy into it, signal() an atomic release store, wait_at_least() an
// acquire-load poll that yields the core (ranks may outnumber cores).
//
// A wait that times out marks the whole group broken: every later or pending operation
// of every rank fails with the first error, as a real job would after losing a rank.
//
// Thread-safety: the group is shared by all rank threads; each communicator (and its
// windows) is used by its own rank's thread only.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace peerserve::dist {

class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  // The communicator of `rank` (0 <= rank < size); call once per rank. It shares the
  // group's state and may outlive the group object.
  std::unique_ptr<Communicator> communicator(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace peerserve::dist
