#include "apps/server_signals.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace peerserve {

sigset_t block_server_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

StartupSignalExit::StartupSignalExit(const sigset_t& signals) : signals_(signals) {
  waiter_ = std::thread([this] {
    while (!done_.load()) {
      timespec poll{0, 100'000'000};
      const int sig = sigtimedwait(&signals_, nullptr, &poll);
      if (sig > 0) {
        std::fprintf(stderr, "\nsignal %d while starting: exiting\n", sig);
        std::fflush(stderr);
        std::_Exit(128 + sig);
      }
    }
  });
}

void StartupSignalExit::done() {
  if (done_.exchange(true)) return;
  if (waiter_.joinable()) waiter_.join();
}

}  // namespace peerserve
