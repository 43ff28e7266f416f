// FunctionRef<R(Args...)>: a non-owning reference to a callable, for calls that run it
// before they return (the thread pool's loops). Unlike std::function it never allocates: a
// lambda capturing more than two pointers made std::function allocate on every loop, tens
// of times per decode step (tests/model/forward_allocation_test.cc).
//
// The callable must outlive every call through the reference; a temporary passed as an
// argument lives until the end of the full expression, which covers the call it is passed to.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace peerserve {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;

  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
           std::is_invocable_r_v<R, F&, Args...>)
      FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like a function parameter
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }
  explicit operator bool() const { return call_ != nullptr; }

 private:
  void* object_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace peerserve
