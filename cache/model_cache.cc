#include "cache/model_cache.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <vector>

#include <unistd.h>

#include "base/file_sync.h"
#include "cache/block_checksum.h"

namespace peerserve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxManifestBytes = 16u << 20;
constexpr size_t kMaxFiles = 4096;

uint64_t text_hash(const std::string& text) {
  return block_checksum(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

PoolKey manifest_key(const std::string& id, const ModelCacheOptions& o) {
  return PoolKey{o.tenant, text_hash("peerserve-model-manifest/1:" + id)};
}

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.';
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result<json> read_manifest(KvBlockStore& pool, const std::string& id, const ModelCacheOptions& o) {
  const PoolKey key = manifest_key(id, o);
  std::string text;
  const BlockSink sink = [&](size_t size) -> std::span<std::byte> {
    if (size > kMaxManifestBytes) return {};
    text.resize(size);
    return {reinterpret_cast<std::byte*>(text.data()), size};
  };
  const BlockLookup r = pool.get({&key, 1}, {&sink, 1}, o.timeout)[0];
  if (r.kind == BlockLookup::Kind::kMiss) {
    return not_found("model cache: the pool holds no model '" + id + "'");
  }
  if (!r.hit()) return r.error.with_context("model cache: reading the manifest of '" + id + "'");
  json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_array() ||
      !manifest.contains("fingerprint") || !manifest["fingerprint"].is_string() ||
      manifest["files"].size() > kMaxFiles) {
    return data_loss("model cache: the manifest of '" + id + "' is malformed");
  }
  return manifest;
}

}  // namespace

Result<ModelCacheTransfer> publish_model(KvBlockStore& pool, const std::string& id,
                                         const fs::path& dir, const std::string& fingerprint,
                                         const ModelCacheOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<fs::path> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && plain_file_name(e.path().filename().string())) {
      files.push_back(e.path());
    }
  }
  if (ec) return io_error("model cache: cannot list " + dir.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());
  ModelCacheTransfer done;
  json manifest = {{"format", "peerserve-model-cache/1"},
                   {"id", id},
                   {"fingerprint", fingerprint},
                   {"chunk_bytes", o.chunk_bytes},
                   {"files", json::array()}};
  std::vector<std::vector<std::byte>> chunks;
  std::vector<PoolKey> keys;
  auto flush = [&]() -> Status {
    if (chunks.empty()) return ok_status();
    std::vector<std::span<const std::byte>> views(chunks.begin(), chunks.end());
    const std::vector<Status> stored = pool.put(keys, views, o.timeout);
    for (size_t i = 0; i < stored.size(); ++i) {
      if (!stored[i].ok()) return stored[i].with_context("model cache: storing a chunk of " + id);
    }
    chunks.clear();
    keys.clear();
    return ok_status();
  };
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return io_error("model cache: cannot read " + path.string());
    json entry = {{"name", path.filename().string()}, {"chunks", json::array()}};
    uint64_t size = 0;
    while (true) {
      std::vector<std::byte> chunk(o.chunk_bytes);
      in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<size_t>(in.gcount());
      if (got == 0) break;
      chunk.resize(got);
      const uint64_t hash = block_checksum(chunk);
      entry["chunks"].push_back(hash);
      size += got;
      keys.push_back(PoolKey{o.tenant, hash});
      chunks.push_back(std::move(chunk));
      if (static_cast<int>(chunks.size()) >= o.chunks_per_call) PS_RETURN_IF_ERROR(flush());
      if (got < o.chunk_bytes) break;
    }
    entry["size"] = size;
    manifest["files"].push_back(std::move(entry));
    done.bytes += size;
    ++done.files;
  }
  PS_RETURN_IF_ERROR(flush());
  // The manifest last: a reader never sees it before its chunks.
  const std::string text = manifest.dump();
  const PoolKey key = manifest_key(id, o);
  const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(text.data()),
                                        text.size());
  const Status stored = pool.put({&key, 1}, {&view, 1}, o.timeout)[0];
  if (!stored.ok()) return stored.with_context("model cache: storing the manifest of " + id);
  done.seconds = seconds_since(start);
  return done;
}

Result<std::string> cached_model_fingerprint(KvBlockStore& pool, const std::string& id,
                                             const ModelCacheOptions& o) {
  PS_ASSIGN_OR_RETURN(json manifest, read_manifest(pool, id, o));
  return manifest["fingerprint"].get<std::string>();
}

Result<ModelCacheTransfer> fetch_model(KvBlockStore& pool, const std::string& id,
                                       const fs::path& dir, const ModelCacheOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  PS_ASSIGN_OR_RETURN(json manifest, read_manifest(pool, id, o));
  const uint64_t chunk_bytes =
      manifest.contains("chunk_bytes") && manifest["chunk_bytes"].is_number_unsigned()
          ? manifest["chunk_bytes"].get<uint64_t>()
          : 0;
  if (chunk_bytes == 0 || chunk_bytes > (1ull << 30)) {
    return data_loss("model cache: the manifest of '" + id + "' has no valid chunk size");
  }
  // Check the whole manifest before writing anything.
  uint64_t total = 0;
  for (const json& f : manifest["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        !plain_file_name(f["name"].get<std::string>()) || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("chunks") || !f["chunks"].is_array()) {
      return data_loss("model cache: the manifest of '" + id + "' names a bad file entry");
    }
    const uint64_t size = f["size"].get<uint64_t>();
    const uint64_t expected_chunks = (size + chunk_bytes - 1) / chunk_bytes;
    if (size > o.max_model_bytes || f["chunks"].size() != expected_chunks) {
      return data_loss("model cache: the manifest of '" + id + "': file " +
                       f["name"].get<std::string>() + " has inconsistent sizes");
    }
    for (const json& c : f["chunks"]) {
      if (!c.is_number_unsigned()) return data_loss("model cache: a bad chunk id in " + id);
    }
    total += size;
    if (total > o.max_model_bytes) return data_loss("model cache: '" + id + "' is too large");
  }
  // Into a staging folder inside `dir` (the same file system, whatever is mounted there, and
  // no write outside it), moved into `dir` when every file is whole, config.json last: a
  // fetch that fails half-way leaves nothing that a later start takes for a checkpoint.
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("model cache: cannot create " + dir.string() + ": " + ec.message());
  const fs::path staging = dir / (".partial-" + std::to_string(::getpid()));
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  if (ec) return io_error("model cache: cannot create " + staging.string() + ": " + ec.message());
  struct RemoveStaging {
    const fs::path& path;
    ~RemoveStaging() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_staging{staging};
  ModelCacheTransfer done;
  for (const json& f : manifest["files"]) {
    const std::string name = f["name"].get<std::string>();
    const uint64_t size = f["size"].get<uint64_t>();
    const fs::path path = staging / name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return io_error("model cache: cannot write " + path.string());
    const json& ids = f["chunks"];
    for (size_t first = 0; first < ids.size(); first += static_cast<size_t>(o.chunks_per_call)) {
      const size_t n = std::min(ids.size() - first, static_cast<size_t>(o.chunks_per_call));
      std::vector<PoolKey> keys;
      std::vector<std::vector<std::byte>> buffers(n);
      std::vector<BlockSink> sinks;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t index = first + i;
        const uint64_t want = std::min(chunk_bytes, size - index * chunk_bytes);
        buffers[i].resize(want);
        keys.push_back(PoolKey{o.tenant, ids[first + i].get<uint64_t>()});
        sinks.push_back(sink_into(buffers[i]));
      }
      const std::vector<BlockLookup> got = pool.get(keys, sinks, o.timeout);
      for (size_t i = 0; i < n; ++i) {
        if (!got[i].hit()) {
          return unavailable("model cache: chunk " + std::to_string(first + i) + " of " + name +
                             " (model '" + id + "') is not in the pool" +
                             (got[i].kind == BlockLookup::Kind::kError
                                  ? ": " + got[i].error.message()
                                  : std::string()));
        }
        if (block_checksum(buffers[i]) != keys[i].hash) {
          return data_loss("model cache: chunk " + std::to_string(first + i) + " of " + name +
                           " does not match its hash");
        }
        out.write(reinterpret_cast<const char*>(buffers[i].data()),
                  static_cast<std::streamsize>(buffers[i].size()));
      }
    }
    out.close();
    if (!out) return io_error("model cache: writing " + path.string() + " failed");
    // Synced before it is moved into DIR, so no name there points at unwritten data.
    if (Status synced = sync_path(path); !synced.ok()) return synced.with_context("model cache");
    done.bytes += size;
    ++done.files;
  }
  std::vector<std::string> names;
  for (const json& f : manifest["files"]) {
    if (f["name"] != "config.json") names.push_back(f["name"].get<std::string>());
  }
  for (const json& f : manifest["files"]) {
    if (f["name"] == "config.json") names.push_back("config.json");  // last
  }
  for (const std::string& name : names) {
    fs::rename(staging / name, dir / name, ec);
    if (ec) {
      return io_error("model cache: cannot move " + (staging / name).string() + " into " +
                      dir.string() + ": " + ec.message());
    }
  }
  if (Status synced = sync_path(dir); !synced.ok()) return synced.with_context("model cache");
  done.seconds = seconds_since(start);
  return done;
}

}  // namespace peerserve
