// Signals of the long-running commands (serve, its router role, cache-server).
#pragma once

#include <signal.h>

#include <atomic>
#include <thread>

namespace peerserve {

// Blocks SIGINT and SIGTERM in the calling thread (threads created later inherit the mask, so
// one thread can take them with sigwait) and ignores SIGPIPE: a log pipe whose reader has
// gone is an error on that write, not the end of a server that is draining its requests.
// Returns the set to wait for.
sigset_t block_server_signals();

// While a server starts (loading weights, fetching a model, waiting for its ranks: minutes),
// SIGINT or SIGTERM ends the process at once with 128 + the signal: there is nothing to drain
// yet, and blocked signals would otherwise wait until it serves. From done() on (or the
// destructor) the server's own signal thread takes them.
class StartupSignalExit {
 public:
  explicit StartupSignalExit(const sigset_t& signals);
  ~StartupSignalExit() { done(); }
  StartupSignalExit(const StartupSignalExit&) = delete;
  StartupSignalExit& operator=(const StartupSignalExit&) = delete;

  void done();

 private:
  sigset_t signals_;
  std::atomic<bool> done_{false};
  std::thread waiter_;
};

}  // namespace peerserve
