#include "tokenizer/internal/oniguruma_escapes.h"

namespace peerserve {
namespace {

// Members of each class, for use inside [...].
constexpr std::string_view kSpace = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
constexpr std::string_view kWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHex = "0-9A-Fa-f";

// Copies an escape with a braced or bracketed argument (\p{..}, \x{..}, \k<..>, ...) whole.
size_t copy_escape_argument(std::string_view pattern, size_t i, std::string& out) {
  // pattern[i] is the letter after the backslash.
  if (i + 1 < pattern.size() && (pattern[i + 1] == '{' || pattern[i + 1] == '<')) {
    const char close = pattern[i + 1] == '{' ? '}' : '>';
    const size_t end = pattern.find(close, i + 2);
    if (end != std::string_view::npos) {
      out.append(pattern.substr(i, end + 1 - i));
      return end + 1;
    }
  }
  out.push_back(pattern[i]);
  return i + 1;
}

}  // namespace

Result<std::string> oniguruma_escapes_for_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // where the class's members begin (after "[" or "[^")
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 'Q') {  // \Q...\E: literal text
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop;
        continue;
      }
      std::string_view members;
      bool negated = false;
      switch (e) {
        case 's':
          members = kSpace;
          break;
        case 'S':
          members = kSpace;
          negated = true;
          break;
        case 'w':
          members = kWord;
          break;
        case 'W':
          members = kWord;
          negated = true;
          break;
        case 'h':
          members = kHex;
          break;
        case 'H':
          members = kHex;
          negated = true;
          break;
        default:
          break;
      }
      if (members.empty()) {
        out.push_back('\\');
        i = copy_escape_argument(pattern, i + 1, out);
        continue;
      }
      if (!in_class) {
        out.append(negated ? "[^" : "[").append(members).append("]");
      } else if (!negated) {
        out.append(members);
      } else if (e == 'H') {
        return invalid_argument("regex /" + std::string(pattern) +
                                "/: \\H inside a character class is not supported");
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      class_start = i;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class: [:alpha:]
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;  // "[]" keeps a literal ]
    out.push_back(c);
    ++i;
  }
  return out;
}

}  // namespace peerserve
