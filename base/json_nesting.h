// The nesting depth check for parsed JSON from untrusted files (checkpoint headers and
// configs, tokenizer files): their real nesting is a few levels, while dump(), the error
// messages built from it and any recursive walk recurse once per level, so a file of a
// million '[' would overflow the stack. Iterative itself. Header-only and generic in the
// JSON type, so base needs no JSON library.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace peerserve {

// OK if no array or object of `value` lies deeper than `max_depth` levels (the top level is
// level 1); else InvalidArgument naming `what`.
template <typename Json>
Status check_json_nesting(const Json& value, size_t max_depth, const std::string& what) {
  std::vector<std::pair<const Json*, size_t>> stack = {{&value, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    if (depth > max_depth) {
      return invalid_argument(what + ": nested deeper than " + std::to_string(max_depth) +
                              " levels of arrays and objects");
    }
    for (const auto& child : *node) stack.emplace_back(&child, depth + 1);
  }
  return ok_status();
}

}  // namespace peerserve
