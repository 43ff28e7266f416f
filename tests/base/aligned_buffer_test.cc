#include "base/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

namespace peerserve {
namespace {

uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

TEST(AlignedBuffer, IsZeroAlignedAndWritableOverItsWholeSize) {
  for (int64_t size : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{4095}, int64_t{1} << 20,
                       (int64_t{5} << 20) + 3}) {
    SCOPED_TRACE(size);
    Result<AlignedBuffer> buffer = AlignedBuffer::allocate(size);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    ASSERT_EQ(buffer->size(), size);
    ASSERT_NE(buffer->data(), nullptr);
    EXPECT_EQ(address(buffer->data()) % AlignedBuffer::kAlignment, 0u);
    std::byte* data = buffer->data();
    for (int64_t i = 0; i < size; ++i) ASSERT_EQ(data[i], std::byte{0}) << "byte " << i;
    for (int64_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>(i * 7);
    for (int64_t i = 0; i < size; ++i) ASSERT_EQ(data[i], static_cast<std::byte>(i * 7));
  }
}

TEST(AlignedBuffer, EmptyAndImpossibleSizes) {
  Result<AlignedBuffer> empty = AlignedBuffer::allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0);
  Result<AlignedBuffer> negative = AlignedBuffer::allocate(-1);
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("-1"), std::string::npos);
  Result<AlignedBuffer> huge = AlignedBuffer::allocate(INT64_MAX);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
}

// Moves hand the memory over; each block is freed once (the sanitizer build checks the
// frees and leaks).
TEST(AlignedBuffer, MovesOwnership) {
  AlignedBuffer a = std::move(AlignedBuffer::allocate(3000)).value();
  std::byte* data = a.data();
  data[0] = std::byte{5};
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(b.data(), data);
  AlignedBuffer c = std::move(AlignedBuffer::allocate(100)).value();
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), 3000);
  EXPECT_EQ(c.data()[0], std::byte{5});
  AlignedBuffer& same = c;  // through a reference: clang warns of a self-move it can see
  c = std::move(same);      // self-move keeps the buffer
  EXPECT_EQ(c.data(), data);
}

}  // namespace
}  // namespace peerserve
