// This process's resident memory, for tests that bound how much a code path touches.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace peerserve::testing {

// VmRSS of /proc/self/status in bytes; -1 when it cannot be read.
inline int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return -1;
}

}  // namespace peerserve::testing
