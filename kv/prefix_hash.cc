#include "kv/prefix_hash.h"

#include <cstring>

#include "base/check.h"

namespace peerserve {
namespace {

// The splitmix64 finaliser: a bijective 64-bit mixer with full avalanche.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

}  // namespace

BlockHash root_block_hash(std::string_view identity) {
  // A domain tag keeps namespace roots apart from token-block hashes of the same words.
  uint64_t h = mix64(kRootBlockHash ^ 0x4e414d4553504143ULL);  // "NAMESPAC"
  size_t i = 0;
  for (; i + 8 <= identity.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, identity.data() + i, 8);
    h = mix64(h + kGolden + word);
  }
  uint64_t tail = 0;
  if (i < identity.size()) std::memcpy(&tail, identity.data() + i, identity.size() - i);
  h = mix64(h + kGolden + tail);
  return mix64(h ^ static_cast<uint64_t>(identity.size()));
}

BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ kGolden);
  for (int32_t token : tokens) {
    h = mix64(h + kGolden + static_cast<uint32_t>(token));
  }
  // Mixing the length in keeps blocks of different sizes apart (defensive: one pool has one
  // block size, but a hash value may outlive a configuration in an external cache).
  return mix64(h ^ (static_cast<uint64_t>(tokens.size()) << 32));
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
