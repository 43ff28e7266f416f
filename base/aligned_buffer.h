// An owned, zero-filled, 64-byte-aligned byte buffer: the storage of packed weight matrices
// and of the KV cache (cache-line aligned, so that kernels can use aligned vector loads).
//
// Movable, not copyable; the contents are plain bytes any number of threads may read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace peerserve {

class AlignedBuffer {
 public:
  static constexpr int64_t kAlignment = 64;

  // ResourceExhausted when the memory cannot be had, InvalidArgument for a negative size.
  // A size of 0 gives an empty buffer (data() is null).
  static Result<AlignedBuffer> allocate(int64_t bytes);

  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace peerserve
