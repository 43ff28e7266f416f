#include "cache/block_stream_server.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>
#include <vector>

#include "base/steady_clock_ns.h"
#include "cache/socket_io.h"

namespace peerserve {

using namespace block_stream;  // NOLINT: the protocol's constants and helpers

Result<std::unique_ptr<BlockStreamServer>> BlockStreamServer::start(
    std::shared_ptr<BlockStreamBackend> backend, const BlockStreamServerOptions& options) {
  const std::string where = options.host + ":" + std::to_string(options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (::getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found) != 0 || !found) {
    return invalid_argument("block-stream server: cannot resolve " + where);
  }
  SocketFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = fd.valid() && ::bind(fd.get(), found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(fd.get(), 64) == 0;
  ::freeaddrinfo(found);
  if (!bound) {
    return unavailable("block-stream server: cannot listen on " + where + ": " +
                       std::strerror(errno));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<BlockStreamServer> server(new BlockStreamServer(std::move(backend), options));
  server->port_ =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  server->listen_fd_ = fd.release();
  server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
  return server;
}

BlockStreamServer::~BlockStreamServer() {
  stop();
}

void BlockStreamServer::stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  std::list<Connection> closing;
  {
    // Under the mutex a connection's fd is open exactly while c.fd >= 0 (its thread closes
    // it under the mutex too), so a shutdown never reaches a number reused by another socket.
    std::lock_guard<std::mutex> lock(mutex_);
    for (Connection& c : connections_) {
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);  // wakes poll()
    }
    closing.splice(closing.end(), connections_);  // nodes stay put: the threads hold them
  }
  for (Connection& c : closing) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void BlockStreamServer::accept_loop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE and the like
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // Reap finished connections first.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    const auto live = std::count_if(connections_.begin(), connections_.end(),
                                    [](const Connection& c) { return !c.evicted; });
    if (stopping_.load() || (live >= options_.max_connections && !evict_idlest_locked()) ||
        !prepare_socket(fd).ok()) {
      ::close(fd);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.fd = fd;
    c.idle_since.store(steady_clock_ns());
    try {
      c.thread = std::thread([this, &c] {
        serve(c);
        std::lock_guard<std::mutex> lock(mutex_);
        ::close(c.fd);
        c.fd = -1;
        c.done.store(true);
      });
    } catch (const std::system_error&) {  // no thread to be had: refuse this connection
      ::close(c.fd);
      connections_.pop_back();
    }
  }
}

bool BlockStreamServer::evict_idlest_locked() {
  Connection* idlest = nullptr;
  for (Connection& c : connections_) {
    const int64_t since = c.idle_since.load();
    if (c.fd < 0 || c.evicted || since == Connection::kBusy) continue;
    if (idlest == nullptr || since < idlest->idle_since.load()) idlest = &c;
  }
  if (idlest == nullptr) return false;
  ::shutdown(idlest->fd, SHUT_RDWR);  // wakes its poll(); its thread closes the fd
  idlest->evicted = true;
  ++evicted_;
  return true;
}

void BlockStreamServer::serve(Connection& connection) {
  // Buffers kept for the connection's life: no allocation per request once they have grown.
  // One grown past kKeptBytes by a large request is given back after it: 256 connections
  // that once read a 32 MiB block each would otherwise hold 8 GiB between requests.
  constexpr size_t kKeptBytes = 1 << 20;
  ScratchVector<std::byte> table;
  std::string reply, block;
  ScratchVector<std::byte> scratch;
  try {
    while (!stopping_.load() && serve_request(connection, table, reply, block, scratch)) {
      if (table.capacity() + scratch.capacity() + reply.capacity() + block.capacity() <=
          kKeptBytes) {
        continue;
      }
      ScratchVector<std::byte>().swap(table);
      ScratchVector<std::byte>().swap(scratch);
      std::string().swap(reply);
      std::string().swap(block);
      // Freed memory stays in this thread's malloc arena otherwise (measured: 40 connections
      // that each read a 32 MiB block and sent a 17.8 MB table held 0.94 GB resident).
      ::malloc_trim(0);
    }
  } catch (const std::bad_alloc&) {
    // A request the memory could not hold ends its connection, not the server.
  }
}

bool BlockStreamServer::serve_request(Connection& connection, ScratchVector<std::byte>& table,
                                      std::string& reply, std::string& block,
                                      ScratchVector<std::byte>& scratch) {
  const int fd = connection.fd;
  std::byte header_bytes[kHeaderBytes];
  // Between requests the client may stay quiet up to the idle timeout.
  connection.idle_since.store(steady_clock_ns());
  if (!read_exact(fd, header_bytes, std::chrono::steady_clock::now() + options_.idle_timeout,
                  "block-stream header")
           .ok()) {
    return false;
  }
  connection.idle_since.store(Connection::kBusy);
  const auto deadline = std::chrono::steady_clock::now() + options_.io_timeout;
  Result<RequestHeader> header = parse_header(header_bytes, options_.limits);
  if (!header.ok()) {
    ++malformed_;
    return false;
  }
  table.resize(header->table_bytes);
  if (!read_exact(fd, table, deadline, "block-stream table").ok()) return false;
  Result<std::vector<TableEntry>> entries = parse_table(*header, table);
  if (!entries.ok()) {
    ++malformed_;
    return false;
  }
  reply.clear();
  // Replies go out in pieces of about 1 MiB; a block's bytes go straight from `block`.
  constexpr size_t kFlushBytes = 1 << 20;
  auto flush = [&](bool more) {
    const Status s = write_all(fd, as_bytes(reply), deadline, "block-stream reply", more);
    reply.clear();
    return s.ok();
  };
  if (header->op == kOpGet) {
    for (const TableEntry& e : *entries) {
      const bool last = &e == &entries->back();
      if (Status valid = validate_pool_key(e.key); !valid.ok()) {
        ++malformed_;
        append_u8(&reply, kError);
        append_status(&reply, valid);
        continue;
      }
      Result<bool> hit = backend_->get(e.key, [&](size_t size) {
        // A stored block is never larger than a put may be; a larger size is a damaged
        // file's word, refused (empty destination) rather than allocated.
        if (size > options_.limits.max_block_bytes) return std::span<std::byte>();
        block.resize(size);
        return std::span<std::byte>(reinterpret_cast<std::byte*>(block.data()), size);
      });
      if (!hit.ok()) {
        append_u8(&reply, kError);
        append_status(&reply, hit.status());
      } else if (!*hit) {
        append_u8(&reply, kMiss);
      } else {
        append_u8(&reply, kHit);
        append_u64(&reply, block.size());
        if (block.size() < 64 * 1024) {
          reply += block;
        } else {
          if (!flush(true)) return false;
          // MSG_MORE on the last bytes of the reply would hold its last segment until the
          // client's delayed ACK (~40 ms): nothing follows to push it out.
          if (!write_all(fd, as_bytes(block), deadline, "block-stream reply", !last).ok()) {
            return false;
          }
        }
      }
      if (reply.size() >= kFlushBytes && !flush(true)) return false;
    }
    return flush(false);
  }
  // A refused block is read past (within the deadline) so that the next one lines up.
  auto skip = [&](uint64_t size) {
    block.resize(64 * 1024);
    return discard_exact(fd, size, std::as_writable_bytes(std::span(block)), deadline,
                         "block-stream put")
        .ok();
  };
  for (const TableEntry& e : *entries) {
    Status refused = validate_pool_key(e.key);
    if (refused.ok() && e.size > options_.limits.max_block_bytes) {
      refused = invalid_argument(
          "block " + to_string(e.key) + " is " + std::to_string(e.size) + " bytes, more than the " +
          std::to_string(options_.limits.max_block_bytes) + " a block may have");
    }
    if (!refused.ok()) {
      ++malformed_;
      if (!skip(e.size)) return false;
      append_status(&reply, refused);
      continue;
    }
    Result<std::span<std::byte>> place =
        backend_->begin_put(e.key, static_cast<size_t>(e.size), scratch);
    if (!place.ok()) {
      if (!skip(e.size)) return false;
      append_status(&reply, place.status());
      continue;
    }
    const bool complete = read_exact(fd, *place, deadline, "block-stream put").ok();
    const Status status = backend_->end_put(e.key, *place, complete);
    if (!complete) return false;
    append_status(&reply, status);
  }
  return flush(false);
}

}  // namespace peerserve
