// This process's resident memory, for tests that bound how much a code path touches.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace peerserve::testing {

// A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"); -1 when it cannot be read.
inline int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size())) * 1024;  // kB
  }
  return -1;
}

// VmRSS in bytes; -1 when it cannot be read.
inline int64_t resident_bytes() {
  return status_bytes("VmRSS:");
}

// VmHWM, the most this process has had resident so far, in bytes; -1 when it cannot be read.
inline int64_t peak_resident_bytes() {
  return status_bytes("VmHWM:");
}

}  // namespace peerserve::testing
