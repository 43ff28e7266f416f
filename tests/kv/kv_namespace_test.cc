// Namespaced block hash chains: every field that makes KV reusable changes the root, and
// chains under different roots share no hash.
#include "kv/kv_namespace.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <vector>

namespace peerserve {
namespace {

KvNamespace mini_namespace() {
  KvNamespace ns;
  ns.tenant = "tenant-a";
  ns.model_id = model_identity(R"({"hidden_size": 1024})", "weights-v1");
  ns.layout = KvLayout{
      .num_layers = 5, .latent_dim = 256, .rope_dim = 32, .block_size = 16, .dtype = DType::kBF16};
  return ns;
}

TEST(KvNamespaceTest, EveryFieldChangesTheRoot) {
  const KvNamespace base = mini_namespace();
  ASSERT_TRUE(base.validate().ok()) << base.validate().to_string();
  const std::vector<std::function<void(KvNamespace&)>> changes = {
      [](KvNamespace& n) { n.tenant = "tenant-b"; },
      [](KvNamespace& n) { n.model_id = model_identity(R"({"hidden_size": 1024})", "weights-v2"); },
      [](KvNamespace& n) { n.layout.dtype = DType::kF32; },
      [](KvNamespace& n) { n.layout.num_layers = 4; },
      [](KvNamespace& n) { n.layout.latent_dim = 512; },
      [](KvNamespace& n) { n.layout.rope_dim = 64; },
      [](KvNamespace& n) { n.layout.block_size = 32; },
      [](KvNamespace& n) { n.layout_version = 2; },
      [](KvNamespace& n) { n.mtp_kv = true; },
      [](KvNamespace& n) { n.compute = "w8a8"; },
      [](KvNamespace& n) { n.compute = "+fp32"; },
  };
  std::set<BlockHash> roots = {base.root_hash(), kRootBlockHash};
  for (size_t i = 0; i < changes.size(); ++i) {
    KvNamespace changed = base;
    changes[i](changed);
    EXPECT_TRUE(roots.insert(changed.root_hash()).second) << "change " << i << " kept the root";
  }
  EXPECT_EQ(mini_namespace().root_hash(), base.root_hash());  // deterministic
  // Without MTP KV the identity is the one engines had before the field existed (pools
  // persisted under it stay valid).
  EXPECT_EQ(base.canonical_identity().find("mtp"), std::string::npos);
  EXPECT_EQ(base.canonical_identity().find("compute"), std::string::npos);
}

TEST(KvNamespaceTest, ChainsUnderDifferentRootsShareNoHash) {
  std::vector<int32_t> tokens(16 * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 1000);
  KvNamespace a = mini_namespace();
  KvNamespace b = a;
  b.tenant = "tenant-b";
  std::vector<BlockHash> chain_a, chain_b, chain_local;
  extend_block_hash_chain(tokens, 16, a.root_hash(), &chain_a);
  extend_block_hash_chain(tokens, 16, b.root_hash(), &chain_b);
  extend_block_hash_chain(tokens, 16, &chain_local);
  ASSERT_EQ(chain_a.size(), 64u);
  std::set<BlockHash> seen(chain_a.begin(), chain_a.end());
  for (BlockHash h : chain_b) EXPECT_FALSE(seen.count(h));
  for (BlockHash h : chain_local) EXPECT_FALSE(seen.count(h));
}

TEST(KvNamespaceTest, ThreeArgumentChainUsesTheLocalRoot) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<BlockHash> implicit, explicit_root;
  extend_block_hash_chain(tokens, 4, &implicit);
  extend_block_hash_chain(tokens, 4, kRootBlockHash, &explicit_root);
  EXPECT_EQ(implicit, explicit_root);
  EXPECT_EQ(implicit[0], hash_block_tokens(kRootBlockHash, std::vector<int32_t>{1, 2, 3, 4}));
}

TEST(KvNamespaceTest, ChainExtendsIncrementally) {
  const KvNamespace ns = mini_namespace();
  std::vector<int32_t> tokens(40, 3);
  std::vector<BlockHash> whole, grown;
  extend_block_hash_chain(tokens, 16, ns.root_hash(), &whole);
  extend_block_hash_chain(std::span<const int32_t>(tokens).first(20), 16, ns.root_hash(), &grown);
  ASSERT_EQ(grown.size(), 1u);
  extend_block_hash_chain(tokens, 16, ns.root_hash(), &grown);
  EXPECT_EQ(grown, whole);
}

TEST(KvNamespaceTest, BadFieldsAreNamed) {
  KvNamespace ns = mini_namespace();
  ns.tenant = "";
  EXPECT_NE(ns.validate().message().find("expected 1 to 64"), std::string::npos);
  ns.tenant = "a/b";
  EXPECT_NE(ns.validate().message().find("'a/b'"), std::string::npos);
  ns.tenant = "..";
  EXPECT_FALSE(ns.validate().ok());
  ns.tenant = std::string(65, 'x');
  EXPECT_FALSE(ns.validate().ok());
  ns = mini_namespace();
  ns.model_id.clear();
  EXPECT_NE(ns.validate().message().find("model_id"), std::string::npos);
  ns = mini_namespace();
  ns.layout.block_size = 0;
  EXPECT_NE(ns.validate().message().find("block_size"), std::string::npos);
  ns = mini_namespace();
  ns.layout_version = 0;
  EXPECT_FALSE(ns.validate().ok());
}

TEST(KvNamespaceTest, ModelIdentityDependsOnConfigAndWeights) {
  const std::string a = model_identity("{\"x\":1}", "w1");
  EXPECT_EQ(a.size(), 17u);
  EXPECT_EQ(a[0], 'm');
  EXPECT_EQ(a, model_identity("{\"x\":1}", "w1"));
  EXPECT_NE(a, model_identity("{\"x\":2}", "w1"));
  EXPECT_NE(a, model_identity("{\"x\":1}", "w2"));
  // The boundary between config and weights id is not ambiguous.
  EXPECT_NE(model_identity("ab", "c"), model_identity("a", "bc"));
}

TEST(KvNamespaceTest, RootHashOfEmptyAndShortIdentities) {
  std::set<BlockHash> roots;
  for (const char* s : {"", "a", "ab", "abcdefgh", "abcdefghi"}) {
    EXPECT_TRUE(roots.insert(root_block_hash(s)).second) << s;
  }
}

}  // namespace
}  // namespace peerserve
