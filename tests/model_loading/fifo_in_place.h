// Replaces a file of a checkpoint folder with a FIFO (what a damaged or hostile folder can
// hold), and runs a load that must refuse it rather than block in open() waiting for a
// writer. If the load has not returned within the deadline, the FIFO is opened for writing,
// which releases a reader blocked in open(), so the test fails instead of hanging.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "base/status.h"

namespace peerserve::testing {

inline bool replace_with_fifo(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return ::mkfifo(path.c_str(), 0600) == 0;
}

// The load's status, or a Internal status when it blocked (then released).
inline Status load_beside_fifo(const std::string& fifo, const std::function<Status()>& load,
                               std::chrono::seconds deadline = std::chrono::seconds(20)) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  std::thread loader([&] { done.set_value(load()); });
  if (result.wait_for(deadline) != std::future_status::ready) {
    for (int attempt = 0; attempt < 100 && result.wait_for(std::chrono::milliseconds(100)) !=
                                               std::future_status::ready;
         ++attempt) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases a blocked open
      if (fd >= 0) ::close(fd);
    }
    loader.join();
    return Status(StatusCode::kInternal, "the load blocked on the FIFO " + fifo);
  }
  loader.join();
  return result.get();
}

}  // namespace peerserve::testing
