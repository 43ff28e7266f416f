#include "kv/prefix_hash.h"

#include <openssl/sha.h>

#include <vector>

#include "base/check.h"

namespace peerserve {
namespace {

// The first 8 bytes of SHA-256 of `bytes`, read little-endian.
uint64_t sha256_prefix(std::span<const unsigned char> bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(bytes.data(), bytes.size(), digest);
  uint64_t h = 0;
  for (int i = 7; i >= 0; --i) h = (h << 8) | digest[i];
  return h;
}

void append_u64(std::vector<unsigned char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

}  // namespace

BlockHash root_block_hash(std::string_view identity) {
  // A domain tag keeps namespace roots apart from token-block hashes.
  thread_local std::vector<unsigned char> message;
  message.assign({'p', 'e', 'e', 'r', 's', 'e', 'r', 'v', 'e', ':', 'r', 'o', 'o', 't', ':'});
  message.insert(message.end(), identity.begin(), identity.end());
  return sha256_prefix(message);
}

BlockHash salted_root_hash(BlockHash root, std::string_view cache_salt) {
  if (cache_salt.empty()) return root;
  // Its own domain tag: a salted root never equals a block hash or a namespace root.
  thread_local std::vector<unsigned char> message;
  message.assign({'p', 'e', 'e', 'r', 's', 'e', 'r', 'v', 'e', ':', 's', 'a', 'l', 't', ':'});
  append_u64(message, root);
  message.insert(message.end(), cache_salt.begin(), cache_salt.end());
  return sha256_prefix(message);
}

BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens) {
  // Little-endian fields, so that every machine sharing a pool computes the same hashes:
  // a tag, the parent hash, the number of tokens, then each token id.
  thread_local std::vector<unsigned char> message;  // kept: no allocation per block
  message.assign({'p', 'e', 'e', 'r', 's', 'e', 'r', 'v', 'e', ':', 'b', 'l', 'o', 'c', 'k', ':'});
  append_u64(message, parent);
  append_u64(message, static_cast<uint64_t>(tokens.size()));
  for (const int32_t token : tokens) {
    const uint32_t t = static_cast<uint32_t>(token);
    for (int i = 0; i < 4; ++i) message.push_back(static_cast<unsigned char>(t >> (8 * i)));
  }
  return sha256_prefix(message);
}

void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size, BlockHash root,
                             std::vector<BlockHash>* chain, int32_t lookahead) {
  PS_CHECK(block_size > 0);
  PS_CHECK(lookahead == 0 || lookahead == 1) << lookahead;
  const size_t usable = tokens.size() < static_cast<size_t>(lookahead)
                            ? 0
                            : tokens.size() - static_cast<size_t>(lookahead);
  const size_t num_full = usable / static_cast<size_t>(block_size);
  PS_CHECK_LE(chain->size(), tokens.size() / static_cast<size_t>(block_size));
  for (size_t b = chain->size(); b < num_full; ++b) {
    const BlockHash parent = b == 0 ? root : (*chain)[b - 1];
    chain->push_back(
        hash_block_tokens(parent, tokens.subspan(b * block_size, block_size + lookahead)));
  }
}

void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size,
                             std::vector<BlockHash>* chain) {
  extend_block_hash_chain(tokens, block_size, kRootBlockHash, chain);
}

}  // namespace peerserve
