#include "cache/block_stream_client.h"

#include <algorithm>
#include <cstring>

#include "cache/block_stream_protocol.h"

namespace peerserve {

using namespace block_stream;  // NOLINT: the protocol's constants and helpers

namespace {

// The buffer a block nobody can take is read through (and dropped).
constexpr size_t kDiscardChunk = size_t{64} << 10;

// Reads a status written by append_status into *remote; the result is the read's own.
Status read_status(int fd, PoolDeadline deadline, const std::string& what, Status* remote) {
  std::byte head[6];
  PS_RETURN_IF_ERROR(read_exact(fd, head, deadline, what));
  const auto code = static_cast<int32_t>(read_u32(head));
  std::string message(read_u16(head + 4), '\0');
  PS_RETURN_IF_ERROR(read_exact(
      fd, std::span<std::byte>(reinterpret_cast<std::byte*>(message.data()), message.size()),
      deadline, what));
  if (code == 0) {
    *remote = ok_status();
  } else if (code < 0 || code > static_cast<int32_t>(StatusCode::kInternal)) {
    *remote = Status(StatusCode::kInternal, message);
  } else {
    *remote = Status(static_cast<StatusCode>(code), message);
  }
  return ok_status();
}

}  // namespace

BlockStreamClient::BlockStreamClient(std::string host, int port, std::string name)
    : host_(std::move(host)), port_(std::to_string(port)), name_(std::move(name)) {}

Result<SocketFd> BlockStreamClient::take(PoolDeadline deadline, bool fresh, bool* reused) {
  *reused = false;
  if (!fresh) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      *reused = true;
      SocketFd fd = std::move(idle_.back());
      idle_.pop_back();
      return fd;
    }
  }
  Result<SocketFd> fd = connect_tcp(host_, port_, deadline);
  if (!fd.ok())
    return unavailable("cache server " + name_ + " (block stream): " + fd.status().message());
  return fd;
}

void BlockStreamClient::give_back(SocketFd fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.size() < 16) idle_.push_back(std::move(fd));
}

namespace {

// Batches go out in requests of at most the protocol's default key count: a server closes the
// connection of a larger one, and the client would then take a healthy member for down.
constexpr size_t kKeysPerRequest = RequestLimits{}.max_keys;

// call(first, n) for each run of at most kKeysPerRequest of `count` keys, results in order.
template <typename T, typename Call>
std::vector<T> in_requests(size_t count, const Call& call) {
  if (count <= kKeysPerRequest) return call(0, count);
  std::vector<T> out;
  out.reserve(count);
  for (size_t first = 0; first < count; first += kKeysPerRequest) {
    std::vector<T> part = call(first, std::min(kKeysPerRequest, count - first));
    out.insert(out.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return out;
}

}  // namespace

std::vector<BlockLookup> BlockStreamClient::get(std::span<const PoolKey> keys,
                                                std::span<const BlockSink> sinks,
                                                PoolDeadline deadline) {
  return in_requests<BlockLookup>(keys.size(), [&](size_t first, size_t n) {
    bool retry = false;
    std::vector<BlockLookup> out =
        get_once(keys.subspan(first, n), sinks.subspan(first, n), deadline, false, &retry);
    if (!retry) return out;
    return get_once(keys.subspan(first, n), sinks.subspan(first, n), deadline, true, &retry);
  });
}

std::vector<Status> BlockStreamClient::put(std::span<const PoolKey> keys,
                                           std::span<const std::span<const std::byte>> blocks,
                                           PoolDeadline deadline) {
  return in_requests<Status>(keys.size(), [&](size_t first, size_t n) {
    bool retry = false;
    std::vector<Status> out =
        put_once(keys.subspan(first, n), blocks.subspan(first, n), deadline, false, &retry);
    if (!retry) return out;
    return put_once(keys.subspan(first, n), blocks.subspan(first, n), deadline, true, &retry);
  });
}

std::vector<BlockLookup> BlockStreamClient::get_once(std::span<const PoolKey> keys,
                                                     std::span<const BlockSink> sinks,
                                                     PoolDeadline deadline, bool fresh,
                                                     bool* retry) {
  std::vector<BlockLookup> out(keys.size());
  *retry = false;
  if (keys.empty()) return out;
  size_t answered = 0;
  auto fail_rest = [&](const Status& status) {
    for (size_t i = answered; i < keys.size(); ++i) out[i] = BlockLookup::failed(status);
    return out;
  };
  bool reused = false;
  Result<SocketFd> fd = take(deadline, fresh, &reused);
  if (!fd.ok()) return fail_rest(fd.status());
  const std::string what = "cache server " + name_ + " (block-stream get)";
  if (Status s = write_all(fd->get(), as_bytes(encode_request(kOpGet, keys)), deadline, what);
      !s.ok()) {
    *retry = reused;
    return fail_rest(s);
  }
  std::vector<std::byte> discard;
  for (; answered < keys.size(); ++answered) {
    std::byte kind;
    if (Status s = read_exact(fd->get(), {&kind, 1}, deadline, what); !s.ok()) {
      *retry = reused && answered == 0;
      return fail_rest(s);
    }
    const auto k = static_cast<uint8_t>(kind);
    if (k == kMiss) {
      out[answered] = BlockLookup::miss();
    } else if (k == kError) {
      Status remote;
      if (Status s = read_status(fd->get(), deadline, what, &remote); !s.ok()) return fail_rest(s);
      out[answered] = BlockLookup::failed(remote);
    } else if (k == kHit) {
      std::byte size_bytes[8];
      if (Status s = read_exact(fd->get(), size_bytes, deadline, what); !s.ok())
        return fail_rest(s);
      const uint64_t size = read_u64(size_bytes);
      if (size > (uint64_t{1} << 36)) {
        return fail_rest(internal_error(what + ": a block of " + std::to_string(size) + " bytes"));
      }
      std::span<std::byte> dst = sinks[answered](static_cast<size_t>(size));
      if (dst.size() != size) {
        // Keep the stream in step, then report the mismatch for this block only. The bytes
        // go through a fixed buffer: the size is the member's word, up to 64 GiB.
        discard.resize(kDiscardChunk);
        if (Status s = discard_exact(fd->get(), size, discard, deadline, what); !s.ok()) {
          return fail_rest(s);
        }
        out[answered] = BlockLookup::failed(invalid_argument(
            "cache block " + to_string(keys[answered]) + " is " + std::to_string(size) +
            " bytes, the destination " + std::to_string(dst.size())));
        continue;
      }
      if (Status s = read_exact(fd->get(), dst, deadline, what); !s.ok()) return fail_rest(s);
      out[answered] = BlockLookup::hit_result();
    } else {
      return fail_rest(internal_error(what + ": malformed reply (kind " + std::to_string(k) + ")"));
    }
  }
  give_back(std::move(fd).value());
  return out;
}

std::vector<Status> BlockStreamClient::put_once(std::span<const PoolKey> keys,
                                                std::span<const std::span<const std::byte>> blocks,
                                                PoolDeadline deadline, bool fresh, bool* retry) {
  std::vector<Status> out(keys.size());
  *retry = false;
  if (keys.empty()) return out;
  auto fail_all = [&](const Status& status) {
    std::fill(out.begin(), out.end(), status);
    return out;
  };
  bool reused = false;
  Result<SocketFd> fd = take(deadline, fresh, &reused);
  if (!fd.ok()) return fail_all(fd.status());
  const std::string what = "cache server " + name_ + " (block-stream put)";
  std::vector<uint64_t> sizes;
  sizes.reserve(blocks.size());
  for (const auto& b : blocks) sizes.push_back(b.size());
  if (Status s =
          write_all(fd->get(), as_bytes(encode_request(kOpPut, keys, sizes)), deadline, what, true);
      !s.ok()) {
    *retry = reused;
    return fail_all(s);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (Status s = write_all(fd->get(), blocks[i], deadline, what, i + 1 < blocks.size());
        !s.ok()) {
      *retry = reused;
      return fail_all(s);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    Status remote;
    if (Status s = read_status(fd->get(), deadline, what, &remote); !s.ok()) {
      *retry = reused && i == 0;  // a put of the same blocks again is harmless
      for (size_t j = i; j < keys.size(); ++j) out[j] = s;
      return out;
    }
    out[i] = remote;
  }
  give_back(std::move(fd).value());
  return out;
}

}  // namespace peerserve
