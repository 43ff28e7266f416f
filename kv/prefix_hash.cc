#include "kv/prefix_hash.h"

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

}  // namespace

BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t token : tokens) {
    h = mix64(h + 0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(token));
  }
  // Mixing the length in keeps blocks of different sizes apart (defensive: one pool has one
  // block size, but a hash value may outlive a configuration in an external cache).
  return mix64(h ^ (static_cast<uint64_t>(tokens.size()) << 32));
}

void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size,
                             std::vector<BlockHash>* chain) {
  PS_CHECK(block_size > 0);
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  PS_CHECK_LE(chain->size(), num_full);
  for (size_t b = chain->size(); b < num_full; ++b) {
    const BlockHash parent = b == 0 ? kRootBlockHash : (*chain)[b - 1];
    chain->push_back(hash_block_tokens(parent, tokens.subspan(b * block_size, block_size)));
  }
}

}  // namespace peerserve
