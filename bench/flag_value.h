// Integer values of the benches' flags, read whole: "abc", "5x", "-3" or a number out of
// range is an error naming the flag (atoi read them as 0, or as whatever led the text).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace peerserve::bench {

// The value of `flag`, in [min, max], or exit 2 with a message.
inline int64_t flag_integer(std::string_view flag, std::string_view text, int64_t min,
                            int64_t max) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < min ||
      value > max) {
    std::fprintf(stderr, "%.*s: expected an integer in [%lld, %lld], got '%.*s'\n",
                 static_cast<int>(flag.size()), flag.data(), static_cast<long long>(min),
                 static_cast<long long>(max), static_cast<int>(text.size()), text.data());
    std::exit(2);
  }
  return value;
}

}  // namespace peerserve::bench
