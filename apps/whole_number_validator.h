// A CLI11 check that an unsigned option's text is a whole number that fits: CLI11 reads "-1"
// into a uint64_t as 2^64 - 1 and clamps 99999999999999999999 to it, so --seed -1, that and
// 18446744073709551615 all gave the same samples.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

namespace peerserve {

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
