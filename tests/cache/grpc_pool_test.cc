// The gRPC transport against an in-process PoolServer on a loopback ephemeral port, with
// blocks over gRPC and over the block-stream data path: round trips through PoolClient, a
// member that is not there, and malformed or truncated messages (the server answers with an
// error and keeps serving).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cache/grpc_pool_transport.h"
#include "cache/pool.grpc.pb.h"
#include "cache/pool_client.h"
#include "cache/pool_server.h"
#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

using std::chrono::milliseconds;
using testing::block_matches;
using testing::make_block;
namespace wire = peerserve::cache::wire;

constexpr milliseconds kTimeout{5000};

// Parameter: whether the server offers the block-stream data path (true) or clients move
// blocks over gRPC (false); every case runs both ways.
class GrpcPoolTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    TieredBlockStoreOptions options;
    options.dram_bytes = 64 << 20;
    auto store = TieredBlockStore::open(options);
    ASSERT_TRUE(store.ok());
    store_ = std::shared_ptr<TieredBlockStore>(std::move(store).value());
    PoolServerOptions server_options;
    server_options.max_keys_per_request = 1000;
    server_options.max_block_bytes = 1 << 20;
    server_options.block_stream_port = GetParam() ? 0 : -1;
    auto server = PoolServer::start(store_, server_options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // Sends `payload` as the raw request bytes of unary method `method`; returns the status.
  grpc::Status send_raw_unary(const std::string& method, const std::string& payload) {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTimeout);
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard lock(mutex);
      status = std::move(s);
      done = true;
      done_cv.notify_one();
    });
    std::unique_lock lock(mutex);
    done_cv.wait(lock, [&] { return done; });
    return status;
  }

  bool server_still_serves() {
    auto client = PoolClient::connect(address_, {});
    if (!client.ok()) return false;
    if (!(*client)->put_one({"alive", 1}, make_block(1, 64), kTimeout).ok()) return false;
    std::vector<std::byte> out(64);
    return (*client)->get_one({"alive", 1}, out, kTimeout).hit() && block_matches(out, 1);
  }

  std::shared_ptr<TieredBlockStore> store_;
  std::unique_ptr<PoolServer> server_;
  std::string address_;
};

TEST_P(GrpcPoolTest, BatchRoundTripOfMiniPresetBlocks) {
  auto client = PoolClient::connect(address_, {});
  ASSERT_TRUE(client.ok());
  constexpr size_t kBlock = 46080;  // mini preset: 5 layers x 16 tokens x 288 x BF16
  std::vector<PoolKey> keys;
  std::vector<std::vector<std::byte>> blocks;
  for (uint64_t i = 0; i < 64; ++i) {
    keys.push_back({"tenant-a", i * 31 + 7});
    blocks.push_back(make_block(i, kBlock));
  }
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  for (const Status& s : (*client)->put(keys, views, kTimeout))
    ASSERT_TRUE(s.ok()) << s.to_string();
  keys.push_back({"tenant-a", 999999});  // absent
  std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<BlockSink> sinks;
  for (auto& b : out) sinks.push_back(sink_into(b));
  std::vector<BlockLookup> results = (*client)->get(keys, sinks, kTimeout);
  for (size_t i = 0; i < 64; ++i) {
    ASSERT_TRUE(results[i].hit()) << i << " " << results[i].error.to_string();
    EXPECT_TRUE(block_matches(out[i], i));
  }
  EXPECT_EQ(results[64].kind, BlockLookup::Kind::kMiss);
  // Another tenant sees nothing of tenant-a.
  std::vector<PoolKey> other_keys = keys;
  for (PoolKey& k : other_keys) k.tenant = "tenant-b";
  for (const BlockLookup& r : (*client)->get(other_keys, sinks, kTimeout)) EXPECT_FALSE(r.hit());
  EXPECT_EQ((*client)->exists(keys, kTimeout)[3], kBlock);
  EXPECT_TRUE((*client)->remove(std::vector<PoolKey>{keys[3]}, kTimeout)[0]);
  EXPECT_FALSE((*client)->exists(keys, kTimeout)[3].has_value());
  auto stats = (*client)->member_stats(kTimeout);
  ASSERT_EQ(stats.size(), 1u);
  ASSERT_TRUE(stats[0].stats.ok());
  EXPECT_EQ(stats[0].stats->dram.blocks, 63u);
  EXPECT_EQ(stats[0].stats->puts, 64u);
}

TEST_P(GrpcPoolTest, PerBlockErrorsComeBackPerBlock) {
  auto client = PoolClient::connect(address_, {});
  ASSERT_TRUE(client.ok());
  const std::vector<PoolKey> keys = {{"ok", 1}, {"bad tenant", 2}, {"ok", 3}};
  std::vector<std::vector<std::byte>> blocks = {make_block(1, 100), make_block(2, 100),
                                                make_block(3, 2 << 20)};  // over 1 MiB limit
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  std::vector<Status> put = (*client)->put(keys, views, kTimeout);
  EXPECT_TRUE(put[0].ok());
  EXPECT_EQ(put[1].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(put[1].message().find("bad tenant"), std::string::npos);
  EXPECT_EQ(put[2].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(put[2].message().find("a block may have"), std::string::npos);
  std::vector<std::byte> out(100);
  EXPECT_TRUE((*client)->get_one(keys[0], out, kTimeout).hit());
  BlockLookup bad = (*client)->get_one(keys[1], out, kTimeout);
  EXPECT_EQ(bad.kind, BlockLookup::Kind::kError);
  EXPECT_GE(server_->malformed_requests(), 2u);
}

TEST_P(GrpcPoolTest, MalformedAndTruncatedMessagesAreErrors) {
  // Bytes that are not a protobuf message at all.
  grpc::Status garbage = send_raw_unary("/peerserve.cache.wire.CachePool/Exists",
                                        std::string("\xff\xff\xff\xff\xff\x0f garbage", 15));
  EXPECT_FALSE(garbage.ok());
  // A valid KeyList cut short in the middle of a field.
  wire::KeyList list;
  for (int i = 0; i < 10; ++i) {
    wire::BlockKey* k = list.add_keys();
    k->set_tenant("tenant");
    k->set_hash(static_cast<uint64_t>(i));
  }
  const std::string whole = list.SerializeAsString();
  grpc::Status truncated =
      send_raw_unary("/peerserve.cache.wire.CachePool/Remove", whole.substr(0, whole.size() - 3));
  EXPECT_FALSE(truncated.ok());
  // Too many keys in one request.
  wire::KeyList many;
  for (int i = 0; i < 1001; ++i) many.add_keys()->set_tenant("t");
  grpc::Status too_many =
      send_raw_unary("/peerserve.cache.wire.CachePool/Exists", many.SerializeAsString());
  EXPECT_EQ(too_many.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_many.error_message().find("1001 keys"), std::string::npos);
  // A method that does not exist.
  EXPECT_EQ(send_raw_unary("/peerserve.cache.wire.CachePool/Nope", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(server_still_serves());
}

TEST_P(GrpcPoolTest, PutChunkWithUnpairedKeysIsRejected) {
  auto stub =
      wire::CachePool::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kTimeout);
  wire::PutReply reply;
  auto writer = stub->Put(&context, &reply);
  wire::PutChunk chunk;
  chunk.add_keys()->set_tenant("t");
  chunk.add_keys()->set_tenant("t");
  chunk.add_data("only one block");
  writer->Write(chunk);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("2 keys and 1 blocks"), std::string::npos);
  EXPECT_TRUE(server_still_serves());
}

TEST_P(GrpcPoolTest, ProbeStreamsTheRequestedBytes) {
  GrpcTransportProbe probe(address_);
  Result<uint64_t> got = probe.run(3 << 20, 46080, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_GE(*got, 3u << 20);
  EXPECT_FALSE(probe.run(1 << 20, 0, kTimeout).ok());
}

INSTANTIATE_TEST_SUITE_P(DataPaths, GrpcPoolTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("BlockStream") : std::string("Grpc");
                         });

TEST(GrpcPoolMemberDownTest, NothingListeningIsAMissWithinTheConnectTimeout) {
  // Bind and close a port so that nothing listens on it.
  TieredBlockStoreOptions options;
  options.dram_bytes = 1 << 20;
  auto store = TieredBlockStore::open(options);
  ASSERT_TRUE(store.ok());
  auto server = PoolServer::start(std::shared_ptr<TieredBlockStore>(std::move(store).value()), {});
  ASSERT_TRUE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  (*server)->shutdown(milliseconds(0));
  server->reset();
  PoolClientOptions client_options;
  client_options.connect_timeout = milliseconds(200);
  auto client = PoolClient::connect(address, client_options);
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> out(64);
  const BlockLookup r = (*client)->get_one({"t", 1}, out, milliseconds(10000));
  EXPECT_EQ(r.kind, BlockLookup::Kind::kMiss);
  EXPECT_EQ((*client)->counters().unavailable_misses, 1u);
  EXPECT_EQ((*client)->put_one({"t", 1}, out, milliseconds(10000)).code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace peerserve
