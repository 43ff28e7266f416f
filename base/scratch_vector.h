// A std::vector for per-step scratch whose resize leaves new elements of trivial types
// uninitialized (default- rather than value-initialized).
//
// Why: a step's buffers shrink and grow with its rows (a prefill's last layer keeps only the
// rows it returns, the next step is a full prefill again), and every regrowth of a plain
// std::vector zero-fills the new part: 1.6% of the samples of a 512-token INT8 prefill on
// the mini preset went to that memset (perf, 2026-11-28). Only buffers that each step writes
// in full before reading may use this type.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace peerserve {

template <typename T>
class DefaultInitAllocator : public std::allocator<T> {
 public:
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };

  using std::allocator<T>::allocator;

  // resize() and the size constructor call construct(p) with no arguments: default-init.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    std::construct_at(p, std::forward<Args>(args)...);
  }
};

template <typename T>
using ScratchVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace peerserve
