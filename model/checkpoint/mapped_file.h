// A whole file mapped read-only into memory (RAII). The OS loads pages on first touch, so a
// mapping costs no resident memory until its bytes are read, and pages stay shareable with
// the page cache; this is what makes BF16 weights usable zero-copy.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"

namespace peerserve {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file gives an empty span (no mapping).
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

  // Hints that [offset, offset + length) will be read soon (madvise WILLNEED); no-op if the
  // range is outside the file.
  void advise_will_need(size_t offset, size_t length) const;
  // Drops the whole pages inside [offset, offset + length) from this process's memory
  // (madvise DONTNEED): for bytes already copied elsewhere. The mapping is read-only, so a
  // later read faults them in from the file again; nothing is lost.
  void release(size_t offset, size_t length) const;

 private:
  struct ConstructionKey {};  // only open() constructs, but make_shared needs a public ctor

 public:
  MappedFile(ConstructionKey, std::string path, const std::byte* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace peerserve
