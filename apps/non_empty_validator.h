// non_empty_text: a CLI11 check that an option's value is not the empty string. `--host ""`
// or `--api-key "$KEY"` with the variable unset would otherwise mean "all interfaces" and "no
// authentication": the opposite of what the flag was given for.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace peerserve {

inline CLI::Validator non_empty_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("an empty value (unset shell variable?)") : "";
      },
      "NOT EMPTY");
}

}  // namespace peerserve
