// Model caching through an in-process pool: a checkpoint folder published by one engine is
// fetched byte for byte into an empty folder by another; a missing model is NotFound; a
// chunk evicted or corrupted in the pool fails the fetch naming the file and leaves no
// partial file; a manifest naming paths outside the folder is refused.
#include "cache/model_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "cache/block_checksum.h"
#include "cache/pool_client.h"
#include "tests/cache/block_test_util.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using testing::make_block;
using testing::ScratchDir;

void write_file(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  if (bytes.empty()) return;  // no write from a null pointer (UBSan)
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());  // never null (UBSan)
  return out;
}

class ModelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TieredBlockStoreOptions store;
    store.dram_bytes = 64 << 20;
    auto pool = PoolClient::open_local(store, {});
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(pool).value();
    options_.chunk_bytes = 1000;  // several chunks per file, a short last one
    options_.chunks_per_call = 3;
    // A checkpoint-like folder: config, a tokenizer, two shards (one empty), a hidden file.
    files_ = {{"config.json", make_block(1, 123)},
              {"tokenizer.json", make_block(2, 2500)},
              {"model-00001-of-00002.safetensors", make_block(3, 7001)},
              {"model-00002-of-00002.safetensors", {}}};
    for (const auto& [name, bytes] : files_) write_file(source_.path() / name, bytes);
    write_file(source_.path() / ".lock", make_block(9, 10));
  }

  std::unique_ptr<PoolClient> pool_;
  ModelCacheOptions options_;
  ScratchDir source_{"model_cache_src"};
  ScratchDir target_{"model_cache_dst"};
  std::map<std::string, std::vector<std::byte>> files_;
};

TEST_F(ModelCacheTest, PublishedModelIsFetchedByteForByte) {
  EXPECT_EQ(cached_model_fingerprint(*pool_, "m", options_).status().code(), StatusCode::kNotFound);
  auto published = publish_model(*pool_, "m", source_.path(), "v1", options_);
  ASSERT_TRUE(published.ok()) << published.status().to_string();
  EXPECT_EQ(published->files, 4);
  EXPECT_EQ(published->bytes, 123u + 2500u + 7001u);
  EXPECT_EQ(*cached_model_fingerprint(*pool_, "m", options_), "v1");
  auto fetched = fetch_model(*pool_, "m", target_.path() / "model", options_);
  ASSERT_TRUE(fetched.ok()) << fetched.status().to_string();
  EXPECT_EQ(fetched->bytes, published->bytes);
  for (const auto& [name, bytes] : files_) {
    EXPECT_EQ(read_file(target_.path() / "model" / name), bytes) << name;
  }
  EXPECT_FALSE(fs::exists(target_.path() / "model" / ".lock"));  // hidden files stay home
  EXPECT_EQ(fetch_model(*pool_, "other", target_.path() / "x", options_).status().code(),
            StatusCode::kNotFound);
  // A new version replaces the manifest; unchanged chunks are shared (content-addressed).
  write_file(source_.path() / "config.json", make_block(4, 123));
  ASSERT_TRUE(publish_model(*pool_, "m", source_.path(), "v2", options_).ok());
  EXPECT_EQ(*cached_model_fingerprint(*pool_, "m", options_), "v2");
  ASSERT_TRUE(fetch_model(*pool_, "m", target_.path() / "v2", options_).ok());
  EXPECT_EQ(read_file(target_.path() / "v2" / "config.json"), make_block(4, 123));
}

TEST_F(ModelCacheTest, MissingOrCorruptChunksFailWithoutPartialFiles) {
  ASSERT_TRUE(publish_model(*pool_, "m", source_.path(), "v1", options_).ok());
  // Chunk 2 of the shard: remove it from the pool.
  const auto shard = make_block(3, 7001);
  const std::span<const std::byte> chunk2(shard.data() + 2000, 1000);
  const PoolKey key{options_.tenant, block_checksum(chunk2)};
  ASSERT_TRUE(pool_->remove({&key, 1}, std::chrono::milliseconds(1000))[0]);
  auto fetched = fetch_model(*pool_, "m", target_.path(), options_);
  ASSERT_FALSE(fetched.ok());
  EXPECT_NE(fetched.status().message().find("model-00001-of-00002.safetensors"), std::string::npos)
      << fetched.status().message();
  // Nothing at all: the files fetched before the missing chunk (config.json first) made the
  // next start take the folder for a checkpoint.
  EXPECT_TRUE(fs::is_empty(target_.path()));
  const std::string staging_prefix = target_.path().filename().string() + ".partial-";
  for (const auto& e : fs::directory_iterator(target_.path().parent_path())) {
    EXPECT_NE(e.path().filename().string().rfind(staging_prefix, 0), 0u) << e.path();
  }
  // Other bytes under the chunk's key: the content hash rejects them.
  const auto wrong = make_block(77, 1000);
  const std::span<const std::byte> wrong_view(wrong);
  ASSERT_TRUE(pool_->put({&key, 1}, {&wrong_view, 1}, std::chrono::milliseconds(1000))[0].ok());
  fetched = fetch_model(*pool_, "m", target_.path(), options_);
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), StatusCode::kDataLoss);
}

// The fetch stays inside its folder: a folder that already holds something else (a volume's
// lost+found) or is a mount point (nothing written beside it, nothing renamed over it) works.
TEST_F(ModelCacheTest, FetchesIntoAFolderThatAlreadyHoldsSomething) {
  ASSERT_TRUE(publish_model(*pool_, "m", source_.path(), "v1", options_).ok());
  fs::create_directories(target_.path() / "vol" / "lost+found");
  auto fetched = fetch_model(*pool_, "m", target_.path() / "vol", options_);
  ASSERT_TRUE(fetched.ok()) << fetched.status().to_string();
  for (const auto& [name, bytes] : files_) {
    EXPECT_EQ(read_file(target_.path() / "vol" / name), bytes) << name;
  }
  EXPECT_TRUE(fs::is_directory(target_.path() / "vol" / "lost+found"));
  // Nothing left beside the folder or inside it but the model and what was there.
  EXPECT_EQ(std::distance(fs::directory_iterator(target_.path()), fs::directory_iterator()), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(target_.path() / "vol"), fs::directory_iterator()),
            static_cast<std::ptrdiff_t>(files_.size()) + 1);
}

TEST_F(ModelCacheTest, ManifestNamingOtherPathsIsRefused) {
  for (const std::string bad : {"../evil", "a/b", ".hidden", ""}) {
    const std::string manifest =
        "{\"format\":\"peerserve-model-cache/1\",\"fingerprint\":\"x\","
        "\"chunk_bytes\":1000,\"files\":[{\"name\":\"" +
        bad + "\",\"size\":0,\"chunks\":[]}]}";
    const PoolKey key{
        options_.tenant,
        block_checksum(std::span<const std::byte>(
            reinterpret_cast<const std::byte*>("peerserve-model-manifest/1:evil"), 31))};
    const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(manifest.data()),
                                          manifest.size());
    ASSERT_TRUE(pool_->put({&key, 1}, {&view, 1}, std::chrono::milliseconds(1000))[0].ok());
    auto fetched = fetch_model(*pool_, "evil", target_.path() / "in", options_);
    ASSERT_FALSE(fetched.ok()) << bad;
    EXPECT_EQ(fetched.status().code(), StatusCode::kDataLoss) << bad;
  }
  EXPECT_FALSE(fs::exists(target_.path().parent_path() / "evil"));
}

}  // namespace
}  // namespace peerserve
