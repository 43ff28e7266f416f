#include "apps/threads_option.h"

namespace peerserve {

void add_threads_option(CLI::App* command, int* threads) {
  command->add_option("--threads", *threads, "Kernel threads (0 = one per core)")
      ->check(CLI::Range(0, kMaxThreadsOption))
      ->capture_default_str();
}

}  // namespace peerserve
