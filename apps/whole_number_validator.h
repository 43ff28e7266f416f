// Numbers of command-line values read whole. require_decimal_integers: integer options take
// decimal text only. whole_number_at_most: a CLI11 check that an
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

// Integers as people write them: an optional minus, then digits without a leading zero.
// CLI11 reads integers with strtoll(..., base 0), so "010" was 8 and "0x50" 80, silently.
inline CLI::Validator decimal_integer_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
        bool ok = text.size() > digits && (text[digits] != '0' || text.size() == digits + 1);
        for (size_t i = digits; ok && i < text.size(); ++i) ok = text[i] >= '0' && text[i] <= '9';
        return ok ? std::string() : "'" + text + "' is not a decimal integer";
      },
      "");  // no description: the help's type stays INT
}

// Adds decimal_integer_text() to every integer option of `app` and its subcommands.
inline void require_decimal_integers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) {
      // First (transform() puts it before the option's checks): "5x" was said to be "not in
      // range 1 to ..." by a range check that could not read it.
      option->transform(decimal_integer_text());
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) require_decimal_integers(*sub);
}

}  // namespace peerserve
