// Prefix hashing for KV block reuse: a full block of tokens is identified by a hash chain,
// hash(parent block's hash, this block's tokens), so that equal hashes mean equal whole
// prefixes, not just equal blocks.
//
// The hash is 64-bit (a splitmix64-style mixer over the parent hash and every token id).
// With N cached blocks the chance of any collision is about N^2 / 2^65: ~3e-10 for 10^5
// blocks, which we accept in exchange for a cheap, allocation-free hash.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace peerserve {

using BlockHash = uint64_t;

// The parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x5045455253455256ULL;  // "PEERSERV"

// Hash of one full block given its parent's hash.
BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens);

// Extends `chain` (hashes of the first chain->size() full blocks of `tokens`) with the hashes
// of every further full block of `tokens`. A trailing partial block is not hashed.
// REQUIRES: block_size > 0 and `chain` was built from the same tokens and block size.
void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size,
                             std::vector<BlockHash>* chain);

}  // namespace peerserve
