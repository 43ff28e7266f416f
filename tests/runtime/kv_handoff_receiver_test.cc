// The decode instance's KV hand-off receiver (runtime/kv_handoff_receiver.h) behind a real
// block-stream server on loopback: pushed blocks land in the destinations of their open
// transfer and nowhere else; a push cut off inside a block never counts; close() waits for
// a block still being received, so the memory can be reused safely after it.
#include "runtime/kv_handoff_receiver.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "cache/block_stream_client.h"
#include "cache/block_stream_protocol.h"
#include "cache/block_stream_server.h"
#include "kv/kv_namespace.h"
#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

namespace bs = block_stream;
using std::chrono::milliseconds;

constexpr size_t kBlockBytes = 4096;

std::vector<std::byte> pattern(uint64_t seed, size_t size = kBlockBytes) {
  return testing::make_block(seed, size);
}

class KvHandoffReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    receiver_ = std::make_shared<KvHandoffReceiver>();
    BlockStreamServerOptions options;
    options.io_timeout = milliseconds(2000);
    auto server = BlockStreamServer::start(receiver_, options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    client_ = std::make_unique<BlockStreamClient>("127.0.0.1", server_->port(), "receiver");
    for (auto& m : memory_) m.assign(kBlockBytes, std::byte{0});
  }

  // Opens a transfer of hashes 1..n into memory_[0..n).
  std::string open(size_t n) {
    std::vector<BlockHash> hashes;
    std::vector<std::span<std::byte>> places;
    for (size_t i = 0; i < n; ++i) {
      hashes.push_back(i + 1);
      places.emplace_back(memory_[i]);
    }
    return receiver_->open(hashes, places);
  }

  std::vector<Status> push(const std::string& transfer, std::vector<BlockHash> hashes,
                           size_t size = kBlockBytes) {
    std::vector<PoolKey> keys;
    std::vector<std::vector<std::byte>> blocks;
    for (BlockHash h : hashes) {
      keys.push_back({transfer, h});
      blocks.push_back(pattern(h, size));
    }
    std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
    return client_->put(keys, views, std::chrono::steady_clock::now() + milliseconds(5000));
  }

  int raw_connection() {
    const int fd = testing::loopback_connection(server_->port());
    EXPECT_GE(fd, 0);
    return fd;
  }

  std::shared_ptr<KvHandoffReceiver> receiver_;
  std::unique_ptr<BlockStreamServer> server_;
  std::unique_ptr<BlockStreamClient> client_;
  std::vector<std::byte> memory_[4];
};

TEST_F(KvHandoffReceiverTest, BlocksLandInTheirTransfersDestinations) {
  const std::string a = open(3);
  std::vector<Status> sent = push(a, {1, 2, 3});
  for (const Status& s : sent) EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(receiver_->wait(a, std::chrono::steady_clock::now() + milliseconds(1000)), 3u);
  EXPECT_EQ(receiver_->close(a), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(memory_[i], pattern(i + 1)) << i;
  EXPECT_EQ(memory_[3], std::vector<std::byte>(kBlockBytes));  // not part of it
  const KvHandoffCounters c = receiver_->counters();
  EXPECT_EQ(c.blocks_received, 3);
  EXPECT_EQ(c.bytes_received, static_cast<int64_t>(3 * kBlockBytes));
  EXPECT_EQ(c.transfers_complete, 1);
  // Names are valid pool tenants and carry 128 random bits each (no counter to guess).
  const std::string b = open(1), d = open(1);
  EXPECT_TRUE(validate_tenant_name(b).ok()) << b;
  EXPECT_EQ(b.size(), std::string("handoff-").size() + 32);
  EXPECT_NE(b.substr(8, 16), d.substr(8, 16));
  EXPECT_NE(b.substr(24), d.substr(24));
  receiver_->close(b);
  receiver_->close(d);
}

TEST_F(KvHandoffReceiverTest, WhatDoesNotBelongToAnOpenTransferIsRefused) {
  const std::string a = open(2);
  // Another transfer's name, a closed one, a block it does not expect, the wrong size, twice.
  EXPECT_EQ(push("handoff-nobody-1", {1})[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(push(a, {9})[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(push(a, {1}, kBlockBytes / 2)[0].code(), StatusCode::kInvalidArgument);
  // Out of order: block 2 first; the leading run is 0 until block 1 arrives.
  EXPECT_TRUE(push(a, {2})[0].ok());
  EXPECT_EQ(receiver_->wait(a, std::chrono::steady_clock::now() + milliseconds(50)), 0u);
  EXPECT_TRUE(push(a, {1})[0].ok());
  EXPECT_EQ(push(a, {1})[0].code(), StatusCode::kInvalidArgument);  // already sent
  EXPECT_EQ(receiver_->close(a), 2u);
  EXPECT_EQ(push(a, {1})[0].code(), StatusCode::kNotFound);  // closed
  EXPECT_EQ(receiver_->counters().blocks_refused, 5);
  EXPECT_EQ(memory_[0], pattern(1));
  EXPECT_EQ(memory_[1], pattern(2));
  // The refused ones left the connection in step: the server still serves the client.
  const std::string b = open(1);
  EXPECT_TRUE(push(b, {1})[0].ok());
  EXPECT_EQ(receiver_->close(b), 1u);
}

TEST_F(KvHandoffReceiverTest, APushCutInsideABlockNeverCountsAndCloseWaitsForIt) {
  const std::string a = open(2);
  // A sender that sends block 1 whole, then half of block 2, then stalls.
  const int fd = raw_connection();
  const std::vector<PoolKey> keys = {{a, 1}, {a, 2}};
  const std::vector<uint64_t> sizes = {kBlockBytes, kBlockBytes};
  std::string request = bs::encode_request(bs::kOpPut, keys, sizes);
  const auto one = pattern(1), two = pattern(2);
  request.append(reinterpret_cast<const char*>(one.data()), one.size());
  request.append(reinterpret_cast<const char*>(two.data()), two.size() / 2);
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  EXPECT_EQ(receiver_->wait(a, std::chrono::steady_clock::now() + milliseconds(200)), 1u);
  // close() must not return while block 2 is being written into its destination.
  std::atomic<bool> closed{false};
  auto closing = std::async(std::launch::async, [&] {
    const size_t n = receiver_->close(a);
    closed = true;
    return n;
  });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(closed.load());
  ::close(fd);  // the sender dies mid-block
  ASSERT_EQ(closing.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(closing.get(), 1u);  // block 2 is not counted
  const KvHandoffCounters c = receiver_->counters();
  EXPECT_EQ(c.blocks_broken, 1);
  EXPECT_EQ(c.transfers_complete, 0);
}

TEST_F(KvHandoffReceiverTest, AStalledSenderIsCutOffByTheServersIoTimeout) {
  const std::string a = open(1);
  const int fd = raw_connection();
  const std::vector<PoolKey> keys = {{a, 1}};
  const std::vector<uint64_t> sizes = {kBlockBytes};
  std::string request = bs::encode_request(bs::kOpPut, keys, sizes);
  request.append(100, 'x');
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::this_thread::sleep_for(milliseconds(100));
  // The sender stays silent; close() returns once the server gives up (2 s here).
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(receiver_->close(a), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  ::close(fd);
}

}  // namespace
}  // namespace peerserve
