// Deadline-bounded I/O on TCP sockets for the block-stream data path: non-blocking sockets
// and poll(), so every read, write and connect ends by its deadline — a peer that is down,
// silent or stops reading is an error, never a hang.
//
// Thread-safety: functions on distinct sockets may run concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "base/status.h"

namespace peerserve {

using SocketDeadline = std::chrono::steady_clock::time_point;

// An owned socket descriptor (closed on destruction).
class SocketFd {
 public:
  SocketFd() = default;
  explicit SocketFd(int fd) : fd_(fd) {}
  ~SocketFd() { reset(); }
  SocketFd(SocketFd&& other) noexcept : fd_(other.release()) {}
  SocketFd& operator=(SocketFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  SocketFd(const SocketFd&) = delete;
  SocketFd& operator=(const SocketFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Connects to host:port (a numeric address or a name) by `deadline`; the socket is
// non-blocking with TCP_NODELAY. Unavailable naming the peer on failure.
Result<SocketFd> connect_tcp(const std::string& host, const std::string& port,
                             SocketDeadline deadline);
// Makes an accepted socket non-blocking with TCP_NODELAY.
Status prepare_socket(int fd);

// Unavailable (with `what` in the message) on a timeout, a reset or the peer closing.
// `more`: more data follows at once (MSG_MORE: fewer small segments).
Status write_all(int fd, std::span<const std::byte> data, SocketDeadline deadline,
                 const std::string& what, bool more = false);
Status read_exact(int fd, std::span<std::byte> data, SocketDeadline deadline,
                  const std::string& what);
// Reads `bytes` bytes and drops them, through `buffer` (not empty): a block nobody takes is
// read past, so the stream stays in step, without a buffer of the size the peer claims.
Status discard_exact(int fd, uint64_t bytes, std::span<std::byte> buffer, SocketDeadline deadline,
                     const std::string& what);

// The parts of "HOST:PORT" as socket calls take them: the host without IPv6 brackets
// ("[::1]:80" -> "::1"), and the port (0 when there is none or it is not a number).
std::string endpoint_host(const std::string& endpoint);
int endpoint_port(const std::string& endpoint);

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace peerserve
