#include "tests/dist/allocation_counter.h"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
thread_local int64_t allocations = 0;

void* counted_allocation(size_t bytes, size_t alignment) {
  ++allocations;
  if (bytes == 0) bytes = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(bytes)
                : std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

namespace peerserve::dist::testing {
int64_t allocations_on_this_thread() {
  return allocations;
}
}  // namespace peerserve::dist::testing

void* operator new(size_t bytes) {
  return counted_allocation(bytes, 0);
}
void* operator new[](size_t bytes) {
  return counted_allocation(bytes, 0);
}
void* operator new(size_t bytes, std::align_val_t align) {
  return counted_allocation(bytes, static_cast<size_t>(align));
}
void* operator new[](size_t bytes, std::align_val_t align) {
  return counted_allocation(bytes, static_cast<size_t>(align));
}
void* operator new(size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
