// PS_CHECK: aborts on a broken invariant (a bug), with file, line and a message.
// User input errors are never CHECKed; they return a Status.
#pragma once

#include <sstream>

namespace peerserve::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace peerserve::detail

// A `while` rather than `if (cond) {} else ...`: no dangling else when used unbraced under
// an `if`. The loop body never finishes: CheckFailure's destructor aborts.
#define PS_CHECK(cond) \
  while (!(cond)) ::peerserve::detail::CheckFailure(__FILE__, __LINE__, #cond)

#define PS_CHECK_EQ(a, b) PS_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define PS_CHECK_LT(a, b) PS_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
#define PS_CHECK_LE(a, b) PS_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
