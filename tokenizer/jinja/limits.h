// Sandbox limits of the template engine. A chat template comes with a checkpoint (often
// downloaded from a hub) and its variables come from clients, so both are untrusted: no
// construct may recurse, allocate or loop without bound. Breaking a limit is a template
// error (Status), as a sandboxed jinja2 raises SecurityError; the caller keeps running.
#pragma once

#include <cstddef>
#include <cstdint>

namespace peerserve::jinja {

// Levels of syntactic nesting: blocks ({% if %}, {% for %}, ...), parentheses, operands
// and every link of an operator, attribute, call or filter chain (each nests one level in
// the syntax tree, which the interpreter walks recursively).
inline constexpr int kMaxSyntaxDepth = 200;
// Levels of nesting of a value (lists, dicts, namespaces), for printing and comparing.
inline constexpr int kMaxValueDepth = 256;
// Nesting of the JSON variables handed to the template.
inline constexpr int kMaxVariableDepth = 128;
// Budgets of one render; the defaults are far above what chat templates need.
struct RenderLimits {
  // Bytes of one computed value (a string, or a list/dict counted with its elements).
  uint64_t max_value_bytes = 64ull << 20;
  // Bytes of rendered output.
  uint64_t max_output_bytes = 64ull << 20;
  // Elements of one computed list (range(), repetition, split, characters of a string).
  int64_t max_list_items = 1'000'000;
  // Expressions evaluated, loop iterations and elements scanned.
  uint64_t max_steps = 100'000'000;
  // Bytes of all values computed (bounds the time spent copying).
  uint64_t max_computed_bytes = 4ull << 30;
};

}  // namespace peerserve::jinja
