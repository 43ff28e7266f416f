// Numbers of command-line values read whole. whole_number_at_most: a CLI11 check that an
// unsigned option's text is a whole number that fits: CLI11 reads "-1"
// into a uint64_t as 2^64 - 1 and clamps 99999999999999999999 to it, so --seed -1, that and
// 18446744073709551615 all gave the same samples.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace peerserve {

// The whole of `text` as a finite number ("1s", "5abc" and "nan" are not numbers).
inline bool parse_finite_number(const std::string& text, double* out) {
  size_t used = 0;
  try {
    *out = std::stod(text, &used);
  } catch (...) {
    return false;
  }
  return !text.empty() && used == text.size() && std::isfinite(*out);
}

inline CLI::Validator whole_number_at_most(uint64_t max = std::numeric_limits<uint64_t>::max(),
                                           uint64_t min = 0) {
  return CLI::Validator(
      [max, min](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
            value > max || value < min) {
          return "'" + text + "' is not a whole number in [" + std::to_string(min) + ", " +
                 std::to_string(max) + "]";
        }
        return {};
      },
      "UINT");
}

}  // namespace peerserve
