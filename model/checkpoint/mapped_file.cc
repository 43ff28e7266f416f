#include "model/checkpoint/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace peerserve {

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO in the folder opens at once and is refused below, instead of the open
  // waiting forever for a writer; nothing changes for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string message = path + ": cannot open: " + std::strerror(err);
    return err == ENOENT ? not_found(message) : io_error(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string message = path + ": cannot stat: " + std::strerror(errno);
    ::close(fd);
    return io_error(message);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const std::byte* data = nullptr;
  if (size > 0) {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const std::string message = path + ": mmap failed: " + std::strerror(errno);
      ::close(fd);
      return io_error(message);
    }
    data = static_cast<const std::byte*>(mapped);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return std::make_shared<const MappedFile>(ConstructionKey{}, path, data, size);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::advise_will_need(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  length = std::min(length, size_ - offset);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  ::madvise(const_cast<std::byte*>(data_) + begin, offset + length - begin, MADV_WILLNEED);
}

void MappedFile::release(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  length = std::min(length, size_ - offset);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page;  // whole pages only
  const size_t end = (offset + length) / page * page;
  if (end <= begin) return;
  ::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace peerserve
