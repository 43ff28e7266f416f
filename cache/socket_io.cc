#include "cache/socket_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace peerserve {
namespace {

int remaining_ms(SocketDeadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on fd; false on timeout (errno-free), true when ready.
Result<bool> wait_for(int fd, short events, SocketDeadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ms = remaining_ms(deadline);
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return unavailable(std::string("poll: ") + std::strerror(errno));
  }
}

// The addresses getaddrinfo found, freed with the list.
using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// getaddrinfo within `deadline`. A numeric address resolves at once; a name is looked up on
// a thread of its own, which is left to finish alone when the deadline passes first
// (getaddrinfo itself waits for the system resolver's timeouts, seconds per server).
Result<AddressList> resolve(const std::string& host, const std::string& port,
                            SocketDeadline deadline) {
  const std::string peer = host + ":" + port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc == 0) return AddressList(found, &::freeaddrinfo);
  if (rc != EAI_NONAME) return unavailable(peer + ": cannot resolve: " + ::gai_strerror(rc));

  struct Lookup {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    int rc = 0;
    addrinfo* found = nullptr;
    ~Lookup() {
      if (found != nullptr) ::freeaddrinfo(found);
    }
  };
  auto lookup = std::make_shared<Lookup>();
  hints.ai_flags = 0;
  // (No thread to be had, e.g. at the process's limit: an error, not an exception out of a
  // caller that returns Result.)
  try {
    std::thread([lookup, host, port, hints] {
      addrinfo* result = nullptr;
      const int code = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
      std::lock_guard<std::mutex> lock(lookup->mutex);
      lookup->rc = code;
      lookup->found = result;
      lookup->done = true;
      lookup->done_cv.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    return unavailable(peer + ": cannot resolve: no thread for the lookup (" + e.what() + ")");
  }
  std::unique_lock<std::mutex> lock(lookup->mutex);
  if (!lookup->done_cv.wait_until(lock, deadline, [&] { return lookup->done; })) {
    return unavailable(peer + ": cannot resolve: no answer in time");
  }
  if (lookup->rc != 0) return unavailable(peer + ": cannot resolve: " + ::gai_strerror(lookup->rc));
  AddressList list(lookup->found, &::freeaddrinfo);
  lookup->found = nullptr;
  return list;
}

}  // namespace

void SocketFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status prepare_socket(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return unavailable(std::string("fcntl: ") + std::strerror(errno));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return ok_status();
}

Result<SocketFd> connect_tcp(const std::string& host, const std::string& port,
                             SocketDeadline deadline) {
  const std::string peer = host + ":" + port;
  Result<AddressList> found = resolve(host, port, deadline);
  if (!found.ok()) return found.status();
  Status last = unavailable(peer + ": no address");
  for (addrinfo* a = found->get(); a != nullptr; a = a->ai_next) {
    SocketFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    if (Status s = prepare_socket(fd.get()); !s.ok()) {
      last = s;
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = unavailable(peer + ": connect: " + std::strerror(errno));
      continue;
    }
    Result<bool> ready = wait_for(fd.get(), POLLOUT, deadline);
    if (!ready.ok() || !*ready) {
      last = unavailable(peer + ": connect: no answer in time");
      continue;
    }
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      last = unavailable(peer + ": connect: " + std::strerror(error));
      continue;
    }
    return fd;
  }
  return last;
}

Status write_all(int fd, std::span<const std::byte> data, SocketDeadline deadline,
                 const std::string& what, bool more) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      PS_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLOUT, deadline));
      if (!ready) return unavailable(what + ": the peer did not take the data in time");
      continue;
    }
    return unavailable(what + ": " + (n < 0 ? std::strerror(errno) : "connection closed"));
  }
  return ok_status();
}

Status read_exact(int fd, std::span<std::byte> data, SocketDeadline deadline,
                  const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::recv(fd, data.data() + done, data.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return unavailable(what + ": connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      PS_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLIN, deadline));
      if (!ready) return unavailable(what + ": no answer in time");
      continue;
    }
    return unavailable(what + ": " + std::strerror(errno));
  }
  return ok_status();
}

Status discard_exact(int fd, uint64_t bytes, std::span<std::byte> buffer, SocketDeadline deadline,
                     const std::string& what) {
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    PS_RETURN_IF_ERROR(read_exact(fd, buffer.first(n), deadline, what));
    left -= n;
  }
  return ok_status();
}

std::string endpoint_host(const std::string& endpoint) {
  std::string host = endpoint.substr(0, endpoint.rfind(':'));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

int endpoint_port(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return 0;
  const std::string digits = endpoint.substr(colon + 1);
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  return std::stoi(digits);
}

}  // namespace peerserve
