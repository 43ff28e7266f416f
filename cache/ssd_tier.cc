#include "cache/ssd_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "base/file_descriptor.h"
#include "base/file_sync.h"
#include "cache/block_checksum.h"
#include "kv/kv_namespace.h"

namespace peerserve {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'P', 'S', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr std::string_view kSuffix = ".kvb";
constexpr std::string_view kTempPrefix = ".tmp-";

struct BlockHeader {
  uint32_t tenant_length = 0;
  uint64_t hash = 0;
  uint64_t payload_size = 0;
  uint64_t payload_checksum = 0;
};

template <typename T>
void store(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

uint64_t header_checksum(std::span<const std::byte> fixed_prefix, std::string_view tenant) {
  std::vector<std::byte> bytes(fixed_prefix.begin(), fixed_prefix.end());
  const auto* t = reinterpret_cast<const std::byte*>(tenant.data());
  bytes.insert(bytes.end(), t, t + tenant.size());
  return block_checksum(bytes);
}

// Header + tenant bytes of a new block file.
std::vector<std::byte> encode_header(const PoolKey& key, std::span<const std::byte> payload) {
  std::vector<std::byte> out(SsdTier::kHeaderBytes + key.tenant.size());
  std::memcpy(out.data(), kMagic, 8);
  store<uint32_t>(out.data() + 8, kFormatVersion);
  store<uint32_t>(out.data() + 12, static_cast<uint32_t>(key.tenant.size()));
  store<uint64_t>(out.data() + 16, key.hash);
  store<uint64_t>(out.data() + 24, payload.size());
  store<uint64_t>(out.data() + 32, block_checksum(payload));
  store<uint64_t>(out.data() + 40,
                  header_checksum(std::span<const std::byte>(out.data(), 40), key.tenant));
  std::memcpy(out.data() + SsdTier::kHeaderBytes, key.tenant.data(), key.tenant.size());
  return out;
}

bool read_exact(int fd, std::byte* dst, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, dst, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    dst += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

bool write_exact(int fd, const std::byte* src, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, src, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    src += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads and checks the header of an open block file against its expected key. Returns the
// header, or nullopt when the file is not a valid block of that key.
std::optional<BlockHeader> read_header(int fd, const PoolKey& key, uint64_t file_bytes) {
  std::byte fixed[SsdTier::kHeaderBytes];
  if (!read_exact(fd, fixed, sizeof(fixed), 0)) return std::nullopt;
  if (std::memcmp(fixed, kMagic, 8) != 0) return std::nullopt;
  if (load<uint32_t>(fixed + 8) != kFormatVersion) return std::nullopt;
  BlockHeader h;
  h.tenant_length = load<uint32_t>(fixed + 12);
  h.hash = load<uint64_t>(fixed + 16);
  h.payload_size = load<uint64_t>(fixed + 24);
  h.payload_checksum = load<uint64_t>(fixed + 32);
  if (h.tenant_length != key.tenant.size() || h.hash != key.hash) return std::nullopt;
  std::string tenant(h.tenant_length, '\0');
  if (!read_exact(fd, reinterpret_cast<std::byte*>(tenant.data()), tenant.size(),
                  SsdTier::kHeaderBytes)) {
    return std::nullopt;
  }
  if (tenant != key.tenant) return std::nullopt;
  if (load<uint64_t>(fixed + 40) !=
      header_checksum(std::span<const std::byte>(fixed, 40), tenant)) {
    return std::nullopt;
  }
  if (file_bytes != SsdTier::kHeaderBytes + h.tenant_length + h.payload_size) return std::nullopt;
  return h;
}

std::optional<BlockHash> parse_block_file_name(const std::string& name) {
  if (name.size() != 16 + kSuffix.size() || !name.ends_with(kSuffix)) return std::nullopt;
  BlockHash hash = 0;
  for (size_t i = 0; i < 16; ++i) {
    const char c = name[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    hash = hash << 4 | static_cast<BlockHash>(digit);
  }
  return hash;
}

Status errno_error(const std::string& what, const fs::path& path) {
  return io_error("SSD tier: " + what + " " + path.string() + ": " + std::strerror(errno));
}

}  // namespace

Result<std::unique_ptr<SsdTier>> SsdTier::open(const SsdTierOptions& options) {
  if (options.dir.empty()) return invalid_argument("SSD tier: no folder given");
  if (options.capacity_bytes == 0) {
    return invalid_argument("SSD tier: capacity 0 bytes, expected > 0");
  }
  for (const auto& [tenant, bytes] : options.tenant_capacity) {
    PS_RETURN_IF_ERROR(validate_tenant_name(tenant));
    if (bytes == 0)
      return invalid_argument("SSD tier: capacity of namespace '" + tenant + "' is 0");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) {
    return io_error("SSD tier: cannot create folder " + options.dir.string() + ": " + ec.message());
  }
  if (!fs::is_directory(options.dir, ec)) {
    return invalid_argument("SSD tier: " + options.dir.string() + " is not a folder");
  }
  auto tier = std::make_unique<SsdTier>(ConstructionKey{}, options);
  const fs::path lock_path = options.dir / kLockFile;
  tier->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (tier->lock_fd_ < 0) {
    return io_error("SSD tier: cannot open " + lock_path.string() + ": " + std::strerror(errno));
  }
  if (::flock(tier->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    return error == EWOULDBLOCK
               ? invalid_argument("SSD tier: " + options.dir.string() +
                                  " is in use by another process (it holds " + lock_path.string() +
                                  "); give each server its own folder")
               : io_error("SSD tier: cannot lock " + lock_path.string() + ": " +
                          std::strerror(error));
  }
  PS_RETURN_IF_ERROR(tier->recover());
  return tier;
}

SsdTier::~SsdTier() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

SsdTier::SsdTier(ConstructionKey, const SsdTierOptions& options) : options_(options) {
  counters_.capacity_bytes = options.capacity_bytes;
}

fs::path SsdTier::block_path(const PoolKey& key) const {
  return options_.dir / key.tenant / (hash_hex(key.hash) + std::string(kSuffix));
}

Status SsdTier::recover() {
  struct Found {
    fs::file_time_type mtime;
    PoolKey key;
    uint64_t file_bytes;
  };
  std::vector<Found> found;
  // The error_code forms throughout: a damaged folder is an error to report, not an
  // exception (range-for's increment and is_directory() without one throw).
  std::error_code ec;
  const fs::directory_iterator end;
  for (fs::directory_iterator tenants(options_.dir, ec); !ec && tenants != end;
       tenants.increment(ec)) {
    const fs::directory_entry& tenant_dir = *tenants;
    const std::string tenant = tenant_dir.path().filename().string();
    std::error_code type_ec;
    if (!tenant_dir.is_directory(type_ec) || !validate_tenant_name(tenant).ok()) continue;
    for (fs::directory_iterator files(tenant_dir.path(), ec); !ec && files != end;
         files.increment(ec)) {
      const fs::directory_entry& file = *files;
      const std::string name = file.path().filename().string();
      std::error_code remove_ec;
      // Only regular files can be ours: a link, folder or device under a block's name is left.
      if (file.symlink_status(remove_ec).type() != fs::file_type::regular) continue;
      if (name.starts_with(kTempPrefix)) {
        fs::remove(file.path(), remove_ec);
        ++recovery_.temp_files_removed;
        continue;
      }
      if (!name.ends_with(kSuffix)) continue;  // not ours
      const std::optional<BlockHash> hash = parse_block_file_name(name);
      const PoolKey key{tenant, hash.value_or(0)};
      const uint64_t file_bytes = file.file_size(remove_ec);
      bool good = hash.has_value() && !remove_ec;
      if (good) {
        FileDescriptor fd(::open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
        good = fd.valid() && read_header(fd.get(), key, file_bytes).has_value();
      }
      if (!good) {
        fs::remove(file.path(), remove_ec);
        ++recovery_.bad_files_removed;
        continue;
      }
      found.push_back(Found{file.last_write_time(remove_ec), key, file_bytes});
    }
    if (ec) break;  // the tenants' increment would clear it
  }
  if (ec) return io_error("SSD tier: cannot scan " + options_.dir.string() + ": " + ec.message());
  // Oldest first, so that the newest ends at the LRU front.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard lock(mutex_);
  for (const Found& f : found) insert_locked(f.key, f.file_bytes);
  const uint64_t evictions_before = counters_.evictions;
  for (const auto& [tenant, quota] : options_.tenant_capacity) enforce_capacity_locked(tenant);
  enforce_capacity_locked("");
  recovery_.evicted_over_capacity = counters_.evictions - evictions_before;
  recovery_.blocks = index_.size();
  recovery_.bytes = used_bytes_;
  return ok_status();
}

void SsdTier::insert_locked(const PoolKey& key, uint64_t file_bytes) {
  auto existing = index_.find(key);
  if (existing != index_.end()) erase_locked(existing->second, /*unlink_file=*/false);
  lru_.push_front(Entry{key, file_bytes});
  index_.emplace(key, lru_.begin());
  used_bytes_ += file_bytes;
  tenant_used_[key.tenant] += file_bytes;
}

void SsdTier::erase_locked(EntryList::iterator it, bool unlink_file) {
  if (unlink_file) ::unlink(block_path(it->key).c_str());
  used_bytes_ -= it->file_bytes;
  auto used = tenant_used_.find(it->key.tenant);
  used->second -= it->file_bytes;
  if (used->second == 0) tenant_used_.erase(used);
  index_.erase(it->key);
  lru_.erase(it);
}

void SsdTier::enforce_capacity_locked(const std::string& tenant) {
  auto quota = options_.tenant_capacity.find(tenant);
  if (quota != options_.tenant_capacity.end()) {
    for (auto it = lru_.end(); it != lru_.begin() && tenant_used_[tenant] > quota->second;) {
      --it;
      if (it->key.tenant != tenant) continue;
      auto victim = it++;
      erase_locked(victim, /*unlink_file=*/true);
      ++counters_.evictions;
    }
    if (tenant_used_[tenant] == 0) tenant_used_.erase(tenant);
  }
  while (used_bytes_ > options_.capacity_bytes && !lru_.empty()) {
    erase_locked(std::prev(lru_.end()), /*unlink_file=*/true);
    ++counters_.evictions;
  }
}

Status SsdTier::put(const PoolKey& key, std::span<const std::byte> bytes) {
  PS_RETURN_IF_ERROR(validate_pool_key(key));
  if (bytes.empty()) return invalid_argument("SSD tier: block " + to_string(key) + " is empty");
  const std::vector<std::byte> header = encode_header(key, bytes);
  const uint64_t file_bytes = header.size() + bytes.size();
  uint64_t limit = options_.capacity_bytes;
  auto quota = options_.tenant_capacity.find(key.tenant);
  if (quota != options_.tenant_capacity.end()) limit = std::min(limit, quota->second);
  if (file_bytes > limit) {
    return invalid_argument("SSD tier: block " + to_string(key) + " needs " +
                            std::to_string(file_bytes) + " bytes, more than the capacity (" +
                            std::to_string(limit) + " bytes)");
  }
  const fs::path final_path = block_path(key);
  std::error_code ec;
  fs::create_directories(final_path.parent_path(), ec);
  uint64_t serial;
  {
    std::lock_guard lock(mutex_);
    serial = ++temp_counter_;
  }
  const fs::path temp_path =
      final_path.parent_path() / (std::string(kTempPrefix) + hash_hex(key.hash) + "-" +
                                  std::to_string(::getpid()) + "-" + std::to_string(serial));
  auto fail = [&](const std::string& what, const fs::path& path) {
    Status status = errno_error(what, path);
    ::unlink(temp_path.c_str());
    std::lock_guard lock(mutex_);
    ++counters_.errors;
    return status;
  };
  {
    FileDescriptor fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) return fail("cannot create", temp_path);
    if (!write_exact(fd.get(), header.data(), header.size()) ||
        !write_exact(fd.get(), bytes.data(), bytes.size())) {
      return fail("cannot write", temp_path);
    }
    if (options_.sync_writes && ::fdatasync(fd.get()) != 0) return fail("cannot sync", temp_path);
  }
  std::lock_guard lock(mutex_);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    Status status = errno_error("cannot rename into", final_path);
    ::unlink(temp_path.c_str());
    ++counters_.errors;
    return status;
  }
  if (options_.sync_writes) {
    // Acknowledged only once durable: the rename's folder, and, once per namespace since
    // start, the tier's folder that holds the namespace's folder (whichever write made it:
    // a concurrent first write must not be acknowledged before it is synced). A failure
    // leaves no block that may vanish at the next restart.
    Status synced = sync_path(final_path.parent_path());
    if (synced.ok() && !synced_tenant_folders_.contains(key.tenant)) {
      synced = sync_path(final_path.parent_path().parent_path());
      if (synced.ok()) synced_tenant_folders_.insert(key.tenant);
    }
    if (!synced.ok()) {
      ::unlink(final_path.c_str());  // it replaced an older copy, if any: that is gone too
      if (auto existing = index_.find(key); existing != index_.end()) {
        erase_locked(existing->second, /*unlink_file=*/false);
      }
      ++counters_.errors;
      return synced.with_context("SSD tier");
    }
  }
  insert_locked(key, file_bytes);
  counters_.bytes_written += bytes.size();
  enforce_capacity_locked(key.tenant);
  return ok_status();
}

Result<bool> SsdTier::get(const PoolKey& key, const BlockSink& sink) {
  {
    std::lock_guard lock(mutex_);
    auto found = index_.find(key);
    if (found == index_.end()) {
      ++counters_.misses;
      return false;
    }
    lru_.splice(lru_.begin(), lru_, found->second);
  }
  struct stat st {};  // of the file this read opened
  auto miss = [&](bool corrupt) -> Result<bool> {
    if (corrupt) reject(key, st);
    std::lock_guard lock(mutex_);
    ++counters_.misses;
    if (corrupt) ++counters_.checksum_failures;
    return false;
  };
  const fs::path path = block_path(key);
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return miss(/*corrupt=*/false);  // evicted or removed meanwhile
  if (::fstat(fd.get(), &st) != 0) return miss(/*corrupt=*/false);
  const std::optional<BlockHeader> header =
      read_header(fd.get(), key, static_cast<uint64_t>(st.st_size));
  if (!header) return miss(/*corrupt=*/true);
  const std::span<std::byte> dst = sink(header->payload_size);
  if (dst.size() != header->payload_size) {
    return invalid_argument("cache block " + to_string(key) + " is " +
                            std::to_string(header->payload_size) + " bytes, the destination " +
                            std::to_string(dst.size()));
  }
  if (!read_exact(fd.get(), dst.data(), dst.size(), kHeaderBytes + header->tenant_length) ||
      block_checksum(dst) != header->payload_checksum) {
    return miss(/*corrupt=*/true);
  }
  ::futimens(fd.get(), nullptr);  // the modification time carries LRU order across restarts
  std::lock_guard lock(mutex_);
  ++counters_.hits;
  counters_.bytes_read += dst.size();
  return true;
}

void SsdTier::reject(const PoolKey& key, const struct stat& opened) {
  std::lock_guard lock(mutex_);
  // Only if the path still names the file that failed: a put of the key renames its new
  // file into place under this mutex, and that copy must stay.
  struct stat now {};
  if (::stat(block_path(key).c_str(), &now) != 0 || now.st_dev != opened.st_dev ||
      now.st_ino != opened.st_ino) {
    return;
  }
  auto found = index_.find(key);
  if (found != index_.end()) erase_locked(found->second, /*unlink_file=*/true);
}

std::optional<uint64_t> SsdTier::size_of(const PoolKey& key) const {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return std::nullopt;
  return found->second->file_bytes - kHeaderBytes - key.tenant.size();
}

bool SsdTier::remove(const PoolKey& key) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return false;
  erase_locked(found->second, /*unlink_file=*/true);
  return true;
}

TierStats SsdTier::stats() const {
  std::lock_guard lock(mutex_);
  TierStats s = counters_;
  s.used_bytes = used_bytes_;
  s.blocks = index_.size();
  s.tenant_used_bytes = tenant_used_;
  return s;
}

}  // namespace peerserve
