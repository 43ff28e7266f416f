#include "base/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace peerserve {

Result<AlignedBuffer> AlignedBuffer::allocate(int64_t bytes) {
  if (bytes < 0) {
    return invalid_argument("buffer of " + std::to_string(bytes) + " bytes: size is negative");
  }
  AlignedBuffer buffer;
  if (bytes == 0) return buffer;
  // Beyond the 128 TiB of a user address space (x86-64, 4-level paging) no allocator can
  // succeed; refused here rather than asked, which also keeps the rounding below from
  // overflowing. (AddressSanitizer's allocator aborts from 1 TiB already: sanitizer builds
  // asked for 1-128 TiB still end there.)
  constexpr int64_t kAddressSpaceBytes = int64_t{1} << 47;
  if (bytes > kAddressSpaceBytes) {
    return resource_exhausted("buffer of " + std::to_string(bytes) +
                              " bytes exceeds the address space");
  }
  const size_t rounded = (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
  buffer.data_ = static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded));
  if (buffer.data_ == nullptr) {
    return resource_exhausted("cannot allocate a buffer of " + std::to_string(bytes) + " bytes");
  }
  std::memset(buffer.data_, 0, rounded);
  buffer.size_ = bytes;
  return buffer;
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace peerserve
