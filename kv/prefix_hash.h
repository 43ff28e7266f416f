// Prefix hashing for KV block reuse: a full block of tokens is identified by a hash chain,
// hash(parent block's hash, this block's tokens), so that equal hashes mean equal whole
// prefixes, not just equal blocks. The first block's parent is a *root* hash; a root derived
// from a KvNamespace (kv/kv_namespace.h) makes chains of different tenants, models, KV
// dtypes, block sizes or layouts disjoint from the first block on, so a cache shared by many
// engines cannot hand one of them a block computed under another configuration.
//
// The hash is the first 64 bits of SHA-256 over the parent hash, the block's token ids and
// its length. A cryptographic hash because prompts are chosen by clients: with the reversible
// mixer used before, a block with the hash of another client's block was found in seconds
// (a meet-in-the-middle on the chain), and its KV, published first, was then served to that
// client's prefix. Finding a block for a given 64-bit SHA-256 prefix costs ~2^64 hashes; a
// collision between two blocks the same client both chooses (~2^32) only harms that client.
// With N cached blocks the chance of an accidental collision is about N^2 / 2^65. ~0.3 us per
// 16-token block (libcrypto), against the milliseconds of computing its KV.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace peerserve {

using BlockHash = uint64_t;

// The root of chains that never leave one engine (its local prefix cache). Chains stored in
// a shared pool use KvNamespace::root_hash() instead.
inline constexpr BlockHash kRootBlockHash = 0x5045455253455256ULL;  // "PEERSERV"

// A root hash derived from `identity` (a canonical description of what makes KV reusable,
// see KvNamespace::canonical_identity). Different identities give different roots; none of
// them equals kRootBlockHash unless by a 2^-64 accident.
BlockHash root_block_hash(std::string_view identity);

// The root of the chains of requests that carry `cache_salt` (OpenAI/vLLM `cache_salt`):
// `root` itself for an empty salt, otherwise a hash of both. Requests with different salts
// then share no block, so a client cannot learn from cache hits (usage.cached_tokens, time to
// first token) whether another client sent a prompt.
BlockHash salted_root_hash(BlockHash root, std::string_view cache_salt);

// Hash of one full block given its parent's hash.
BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens);

// Extends `chain` (hashes of the first chain->size() full blocks of `tokens`) with the hashes
// of every further full block of `tokens`, the first block hashed under `root`. A trailing
// partial block is not hashed.
//
// With `lookahead` = 1 a block is hashed together with the token after it, and only once that
// token exists: the KV of the MTP layer at a block's last position is computed from the next
// token (the MTP input at position p is token p + 1), so with MTP KV in the cache a block's
// bytes depend on that token too. Such hashes never equal those without lookahead (the
// length is mixed in). Each element keeps the mode it was appended in.
// REQUIRES: block_size > 0, lookahead in {0, 1}, and `chain` was built from the same tokens,
// block size and root.
void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size, BlockHash root,
                             std::vector<BlockHash>* chain, int32_t lookahead = 0);

// The same under kRootBlockHash (a chain private to one engine).
void extend_block_hash_chain(std::span<const int32_t> tokens, int32_t block_size,
                             std::vector<BlockHash>* chain);

}  // namespace peerserve
