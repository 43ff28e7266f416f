// Model caching (paper 000 §4.4.1): a checkpoint's files stored in the caching pool, so that
// the first engine reads the checkpoint from disk and publishes it, and later engines — other
// processes, other hosts without the files — load it from the pool's DRAM.
//
// Layout in the pool (tenant "models" by default):
//   manifest   under hash("peerserve-model-manifest/1:" + id): JSON naming the files, their
//              sizes and, per chunk, the chunk's XXH3-64 content hash
//   chunks     under their content hash: up to `chunk_bytes` of one file
// Chunks are content-addressed, so two versions of a model share their unchanged chunks and
// a chunk can never be returned for the wrong content (each is verified on fetch). The
// manifest is version-aware: it carries the publisher's checkpoint fingerprint, and a new
// publication of the same id replaces it (readers either see the old manifest with its
// chunks or the new one).
//
// Fetching writes each file under a temporary name, verifies every chunk, then renames; a
// fetch that fails leaves no partial file behind. Checkpoint files are untrusted: names are
// plain file names (no '/', no '..'), sizes and chunk counts are bounded.
//
// Thread-safety: the functions may run concurrently on distinct directories.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "base/status.h"
#include "cache/kv_block_store.h"

namespace peerserve {

struct ModelCacheOptions {
  std::string tenant = "models";
  uint64_t chunk_bytes = 16ull << 20;  // stays under the cache server's 32 MiB block limit
  int chunks_per_call = 4;             // gets/puts in flight per pool call
  std::chrono::milliseconds timeout{60000};
  uint64_t max_model_bytes = 1ull << 40;  // what a manifest may describe at most
};

struct ModelCacheTransfer {
  int64_t files = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Stores every regular file directly in `dir` under model `id`, with `fingerprint` (any text
// naming the version) in the manifest.
Result<ModelCacheTransfer> publish_model(KvBlockStore& pool, const std::string& id,
                                         const std::filesystem::path& dir,
                                         const std::string& fingerprint,
                                         const ModelCacheOptions& options = {});

// Whether the pool holds a manifest for `id` (and its fingerprint then).
Result<std::string> cached_model_fingerprint(KvBlockStore& pool, const std::string& id,
                                             const ModelCacheOptions& options = {});

// Writes model `id` from the pool into `dir` (created if missing; files there with the same
// names are replaced). The files are written into a staging folder inside `dir` and moved into
// place when all are whole, config.json last, so a failed fetch leaves nothing that looks like
// a checkpoint. NotFound when the pool has no manifest for `id`;
// Unavailable/DataLoss naming the file when a chunk is missing or corrupt.
Result<ModelCacheTransfer> fetch_model(KvBlockStore& pool, const std::string& id,
                                       const std::filesystem::path& dir,
                                       const ModelCacheOptions& options = {});

}  // namespace peerserve
