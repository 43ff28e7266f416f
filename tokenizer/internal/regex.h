// A compiled PCRE2 pattern (UTF + UCP, JIT-compiled when the platform supports it) that
// lists the non-empty matches in a subject. Thread-safe: match state is per call.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace peerserve {

class Regex {
 public:
  // `literal` treats the pattern as a plain string (Hugging Face's {"String": ...}).
  // Patterns using \C (one byte, even in UTF mode) are refused.
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Appends [start, end) byte offsets of the successive non-empty, non-overlapping
  // matches in `subject`; lookarounds see nothing outside `subject`.
  // Invalid UTF-8 in `subject` is an error.
  Status find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& matches) const;

  bool jit_compiled() const;
  const std::string& pattern() const;

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve
