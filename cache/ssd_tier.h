// SsdTier: the persistent tier of a cache server, one file per block.
//
// Layout: <dir>/<tenant>/<16 hex digits of the hash>.kvb. Each file is a 48-byte header
// (magic "PSKVBLK1", format version, tenant length, hash, payload size, XXH3-64 of the
// payload, XXH3-64 of the header and tenant), the tenant name, then the payload.
//
// Writes are two-phase: the whole file is written under a unique temporary name in the
// tenant's folder, then renamed over the final name, which is atomic; a reader opens either
// the old complete file or the new one, never a partial file, and two writers of the same
// key each write their own temporary file (the last rename wins). With sync_writes the file
// is fdatasync'ed before the rename and the folder after it (survives power loss; without
// it a block survives a crash of the process, which leaves the page cache intact).
//
// Reads verify the header against the key and the payload against its checksum after
// reading it into the caller's sink; a block that fails is a miss, counted in
// checksum_failures, and its file is deleted. After a restart, open() rebuilds the index by
// scanning the folder (headers only; payloads are verified when read), deletes leftover
// temporary files and files with bad headers, and orders blocks for LRU by modification
// time (reads refresh it). Past its capacity (or a tenant's), the tier deletes its least
// recently used files; capacity is enforced after each write lands, so writes in progress
// may exceed it briefly.
//
// Thread-safety: every method may be called from any thread; file I/O runs outside the
// index lock.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "cache/block_sink.h"
#include "cache/pool_key.h"
#include "cache/tier_stats.h"

namespace peerserve {

struct SsdTierOptions {
  std::filesystem::path dir;                        // created if missing
  uint64_t capacity_bytes = 0;                      // file bytes (header + payload), > 0
  std::map<std::string, uint64_t> tenant_capacity;  // optional per-tenant limits
  bool sync_writes = false;                         // fdatasync before rename
};

// What open() found in an existing folder.
struct SsdRecovery {
  uint64_t blocks = 0;              // recovered and served again
  uint64_t bytes = 0;               // their file bytes
  uint64_t temp_files_removed = 0;  // writes interrupted by a crash
  uint64_t bad_files_removed = 0;   // bad header, wrong name or wrong size
  uint64_t evicted_over_capacity = 0;
};

class SsdTier {
  struct ConstructionKey {};

 public:
  static constexpr uint64_t kHeaderBytes = 48;

  // Creates `dir` if needed, locks it and recovers the blocks in it (only regular files named
  // as its own are touched). Errors: capacity 0, a folder that cannot be created or read, a
  // folder another process's tier holds, a bad tenant name in tenant_capacity.
  static Result<std::unique_ptr<SsdTier>> open(const SsdTierOptions& options);
  SsdTier(ConstructionKey, const SsdTierOptions& options);

  // Writes the block durably (see above) and evicts past capacity. Errors: InvalidArgument
  // for an empty block, a bad tenant or a block larger than the tier or the tenant's
  // capacity; IoError naming the file for a failed write.
  Status put(const PoolKey& key, std::span<const std::byte> bytes);

  // Reads and verifies the block into sink(size). False on a miss, including a block that
  // failed verification or a file evicted during the read (the sink's buffer is then
  // unspecified). Errors only from a sink that returns a span of the wrong size.
  Result<bool> get(const PoolKey& key, const BlockSink& sink);

  // Payload size of a stored block, or nullopt. Does not read the file.
  std::optional<uint64_t> size_of(const PoolKey& key) const;
  bool remove(const PoolKey& key);

  TierStats stats() const;
  const SsdRecovery& recovery() const { return recovery_; }
  // The file that holds (or would hold) `key`.
  std::filesystem::path block_path(const PoolKey& key) const;

 private:
  struct Entry {
    PoolKey key;
    uint64_t file_bytes = 0;
  };
  using EntryList = std::list<Entry>;

  Status recover();
  // Adds a landed file at the LRU front (replacing an older entry of the key). Lock held.
  void insert_locked(const PoolKey& key, uint64_t file_bytes);
  void erase_locked(EntryList::iterator it, bool unlink_file);
  // Deletes least recently used files until the tier (and the tenant) fit. Lock held.
  void enforce_capacity_locked(const std::string& tenant);
  // Drops a block whose file `opened` failed verification, if the path still names that file
  // (not a newer copy put meanwhile) and the index still lists it.
  void reject(const PoolKey& key, const struct stat& opened);

  SsdTierOptions options_;
  SsdRecovery recovery_;
  mutable std::mutex mutex_;
  EntryList lru_;  // front = most recently used
  std::unordered_map<PoolKey, EntryList::iterator, PoolKeyHasher> index_;
  std::map<std::string, uint64_t> tenant_used_;
  // Namespaces whose folder entry in the tier's folder was synced since start (sync_writes).
  std::set<std::string> synced_tenant_folders_;
  uint64_t used_bytes_ = 0;
  uint64_t temp_counter_ = 0;
  TierStats counters_;
  // The tier's folder is locked (flock on kLockFile) for its lifetime: a second process on
  // the same folder would delete this one's writes in flight and evict its files.
  int lock_fd_ = -1;

 public:
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;
  static constexpr const char* kLockFile = ".peerserve-ssd-tier.lock";
};

}  // namespace peerserve
