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
  // aligned_alloc wants a multiple of the alignment; the check keeps the rounding from
  // overflowing.
  if (static_cast<uint64_t>(bytes) > SIZE_MAX / 2) {
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
