// --threads N for the commands that compute (generate, score, serve, quantize): the kernel
// threads, 0 for one per core. Bounded, so that a typo is an error naming the option rather
// than a thread pool the system cannot create.
#pragma once

#include <CLI/CLI.hpp>

namespace peerserve {

inline constexpr int kMaxThreadsOption = 1024;

void add_threads_option(CLI::App* command, int* threads);

}  // namespace peerserve
