#include "grammar/json_string_pattern.h"

#include "grammar/regex_automaton.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace peerserve::grammar {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxGroupDepth = 32;
// A schema's pattern is a short hand-written regex; the bound keeps the translation and its
// recursion small whatever a request sends.
constexpr size_t kMaxPatternBytes = 8192;

// A set of code points: sorted, disjoint, non-adjacent closed ranges.
using CodeSet = std::vector<std::pair<char32_t, char32_t>>;

CodeSet normalized(CodeSet set) {
  std::sort(set.begin(), set.end());
  CodeSet out;
  for (const auto& [lo, hi] : set) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

// Every code point that UTF-8 can carry (surrogates excluded) and `set` does not hold.
CodeSet complement(const CodeSet& set) {
  CodeSet with_surrogates = set;
  with_surrogates.emplace_back(0xD800, 0xDFFF);
  CodeSet out;
  char32_t next = 0;
  for (const auto& [lo, hi] : normalized(std::move(with_surrogates))) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

CodeSet intersect(const CodeSet& a, const CodeSet& b) {
  CodeSet out;
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    const char32_t lo = std::max(a[i].first, b[j].first);
    const char32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

bool contains(const CodeSet& set, char32_t c) {
  return std::any_of(set.begin(), set.end(),
                     [c](const auto& range) { return range.first <= c && c <= range.second; });
}

// ECMAScript's classes (non-Unicode mode): JSON Schema patterns are ECMA-262 regexes.
const CodeSet kDigits = {{'0', '9'}};
const CodeSet kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodeSet kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                        {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodeSet kLineTerminators = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};
// What JSON text cannot hold as itself inside a string.
const CodeSet kJsonEscaped = {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}};

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The code point at s[i], advancing i; nullopt for malformed UTF-8.
std::optional<char32_t> decode_utf8(std::string_view s, size_t& i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) {
    ++i;
    return lead;
  }
  size_t length = 0;
  char32_t c = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    c = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    c = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    c = lead & 0x07;
  } else {
    return std::nullopt;
  }
  if (i + length > s.size()) return std::nullopt;
  for (size_t k = 1; k < length; ++k) {
    const auto next = static_cast<unsigned char>(s[i + k]);
    if ((next & 0xC0) != 0x80) return std::nullopt;
    c = (c << 6) | (next & 0x3F);
  }
  constexpr std::array<char32_t, 5> kSmallest = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kSmallest[length] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) {
    return std::nullopt;
  }
  i += length;
  return c;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One hex digit of a "\u00XX" escape; JSON allows either case for a letter.
std::string hex_digit_regex(unsigned digit) {
  constexpr std::string_view kLower = "0123456789abcdef";
  constexpr std::string_view kUpper = "0123456789ABCDEF";
  if (digit < 10) return std::string(1, kLower[digit]);
  return std::string("[") + kLower[digit] + kUpper[digit] + "]";
}

std::string hex_byte(unsigned value) {
  constexpr std::string_view kDigits = "0123456789abcdef";
  return std::string(R"(\x)") + kDigits[value >> 4] + kDigits[value & 15];
}

// A regex fragment and whether a quantifier may follow it without a group around it.
struct Piece {
  std::string text;
  bool single = true;
};

// The regex for the JSON text of the one character `c`.
Piece encoded_char(char32_t c) {
  switch (c) {
    case '"':
      return {R"(\\")", false};
    case '\\':
      return {R"(\\\\)", false};
    case '\b':
      return {R"(\\b)", false};
    case '\f':
      return {R"(\\f)", false};
    case '\n':
      return {R"(\\n)", false};
    case '\r':
      return {R"(\\r)", false};
    case '\t':
      return {R"(\\t)", false};
    default:
      break;
  }
  if (c < 0x20) return {R"(\\u00)" + hex_digit_regex(c >> 4) + hex_digit_regex(c & 15), false};
  std::string utf8;
  append_utf8(utf8, c);
  std::string text = escape_regex(utf8);
  const bool single = utf8.size() == 1;
  return {std::move(text), single};
}

std::string class_char(char32_t c) {
  if (c < 0x20 || c == 0x7F) return hex_byte(c);
  if (c == '\\' || c == ']' || c == '[' || c == '^' || c == '-') return std::string("\\") + char(c);
  std::string utf8;
  append_utf8(utf8, c);
  return utf8;
}

// `[...]` or `[^...]` for a non-empty set, whichever lists fewer ranges.
std::string class_text(const CodeSet& set) {
  const CodeSet others = complement(set);
  const bool negate = others.size() < set.size();
  std::string text = negate ? "[^" : "[";
  auto add_range = [&text](char32_t lo, char32_t hi) {
    text += class_char(lo);
    if (hi > lo + 1) text += '-';
    if (hi > lo) text += class_char(hi);
  };
  for (const auto& [lo, hi] : negate ? others : set) {
    // A range from ASCII into multi-byte characters is split there, so that a byte-wise
    // regex library (std::regex, the tests' reference) still reads a valid class.
    if (lo < 0x80 && hi >= 0x80) {
      add_range(lo, 0x7F);
      add_range(0x80, hi);
    } else {
      add_range(lo, hi);
    }
  }
  return text + "]";
}

// The regex for the JSON text of any one character of `set` (non-empty).
Piece set_piece(const CodeSet& set) {
  std::vector<std::string> alternatives;
  const CodeSet plain = intersect(set, complement(kJsonEscaped));
  if (!plain.empty()) alternatives.push_back(class_text(plain));
  std::string short_escapes;
  if (contains(set, '"')) short_escapes += '"';
  if (contains(set, '\\')) short_escapes += R"(\\)";
  constexpr std::array<std::pair<char32_t, char>, 5> kShort = {
      {{'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}}};
  for (const auto& [c, letter] : kShort) {
    if (contains(set, c)) short_escapes += letter;
  }
  if (!short_escapes.empty()) alternatives.push_back(R"(\\[)" + short_escapes + "]");
  // The other control characters, as \u00XX grouped by the first hex digit.
  std::vector<std::string> unicode_escapes;
  for (unsigned high = 0; high < 2; ++high) {
    std::string lows;
    for (unsigned low = 0; low < 16; ++low) {
      const char32_t c = high * 16 + low;
      const bool has_short = std::any_of(kShort.begin(), kShort.end(),
                                         [c](const auto& entry) { return entry.first == c; });
      if (!has_short && contains(set, c)) {
        lows += hex_digit_regex(low).substr(low < 10 ? 0 : 1, low < 10 ? 1 : 2);
      }
    }
    if (!lows.empty()) unicode_escapes.push_back(std::to_string(high) + "[" + lows + "]");
  }
  if (unicode_escapes.size() == 1) alternatives.push_back(R"(\\u00)" + unicode_escapes[0]);
  if (unicode_escapes.size() == 2) {
    alternatives.push_back(R"(\\u00(?:)" + unicode_escapes[0] + "|" + unicode_escapes[1] + ")");
  }
  if (alternatives.size() == 1) return {alternatives[0], alternatives[0][0] == '['};
  std::string text = "(?:";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) text += '|';
    text += alternatives[i];
  }
  return {text + ")", true};
}

// An escape's meaning: one character (usable as a class range end) or a set.
struct EscapeValue {
  CodeSet set;
  bool is_char = false;
};

EscapeValue one_char(char32_t c) {
  return {{{c, c}}, true};
}

class PatternParser {
 public:
  explicit PatternParser(std::string_view pattern) : p_(pattern) {}

  Result<std::string> parse() {
    if (p_.size() > kMaxPatternBytes) {
      return invalid_argument("longer than " + std::to_string(kMaxPatternBytes) + " bytes");
    }
    if (!p_.empty() && p_.front() == '^') p_.remove_prefix(1);
    if (!p_.empty() && p_.back() == '$') {
      size_t backslashes = 0;
      while (backslashes + 1 < p_.size() && p_[p_.size() - 2 - backslashes] == '\\') {
        ++backslashes;
      }
      if (backslashes % 2 == 0) p_.remove_suffix(1);
    }
    PS_ASSIGN_OR_RETURN(std::string regex, alternation(0));
    if (!done()) return error("unmatched ')'");
    return regex;
  }

 private:
  bool done() const { return i_ >= p_.size(); }

  Status error(const std::string& what) const {
    return invalid_argument(what + " at offset " + std::to_string(i_));
  }

  Result<std::string> alternation(int depth) {
    PS_ASSIGN_OR_RETURN(std::string out, sequence(depth));
    while (!done() && p_[i_] == '|') {
      ++i_;
      PS_ASSIGN_OR_RETURN(std::string next, sequence(depth));
      out += '|';
      out += next;
    }
    return out;
  }

  Result<std::string> sequence(int depth) {
    std::string out;
    while (!done() && p_[i_] != '|' && p_[i_] != ')') {
      PS_ASSIGN_OR_RETURN(Piece piece, atom(depth));
      PS_RETURN_IF_ERROR(quantified(piece, out));
    }
    return out;
  }

  // Parses {n}, {n,} or {n,m} at i_ without consuming it; false if it is not one.
  bool braces_at(size_t& end, int& lo, std::optional<int>& hi) const {
    size_t j = i_ + 1;
    auto number = [&](int& value) {
      const size_t start = j;
      value = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && j - start < 6) {
        value = value * 10 + (p_[j++] - '0');
      }
      return j > start;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      int value = 0;
      hi = number(value) ? std::optional<int>(value) : std::nullopt;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    end = j + 1;
    return true;
  }

  bool quantifier_at() const {
    if (done()) return false;
    if (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?') return true;
    size_t end = 0;
    int lo = 0;
    std::optional<int> hi;
    return p_[i_] == '{' && braces_at(end, lo, hi);
  }

  // Appends `piece` and the quantifier that follows it, if any.
  Status quantified(const Piece& piece, std::string& out) {
    if (!quantifier_at()) {
      out += piece.text;
      return ok_status();
    }
    std::string quantifier;
    if (p_[i_] == '{') {
      size_t end = 0;
      int lo = 0;
      std::optional<int> hi;
      braces_at(end, lo, hi);
      if (lo > kMaxRepeat || (hi && *hi > kMaxRepeat)) {
        return error("repetition count above " + std::to_string(kMaxRepeat));
      }
      if (hi && *hi < lo) return error("repetition {n,m} with m < n");
      quantifier = std::string(p_.substr(i_, end - i_));
      i_ = end;
    } else {
      quantifier = std::string(1, p_[i_++]);
    }
    if (!done() && p_[i_] == '?') ++i_;  // lazy: the same language under a full match
    if (quantifier_at()) return error("nothing to repeat");
    out += piece.single ? piece.text : "(?:" + piece.text + ")";
    out += quantifier;
    return ok_status();
  }

  Result<Piece> atom(int depth) {
    const char c = p_[i_];
    switch (c) {
      case '(':
        return group(depth);
      case '[': {
        PS_ASSIGN_OR_RETURN(CodeSet set, bracket_class());
        if (set.empty()) return error("a class that matches no character");
        return set_piece(set);
      }
      case '.':
        ++i_;
        return set_piece(complement(kLineTerminators));
      case '\\': {
        PS_ASSIGN_OR_RETURN(EscapeValue value, escape(false));
        if (value.is_char) return encoded_char(value.set[0].first);
        return set_piece(value.set);
      }
      case '*':
      case '+':
      case '?':
        return error("nothing to repeat");
      case '{':
        return error("a literal '{' must be escaped as '\\{'");
      case '^':
      case '$':
        return error(std::string("anchor '") + c + "' inside the pattern is not supported");
      default:
        break;
    }
    PS_ASSIGN_OR_RETURN(char32_t code_point, next_char());
    return encoded_char(code_point);
  }

  Result<char32_t> next_char() {
    const std::optional<char32_t> c = decode_utf8(p_, i_);
    if (!c) return error("malformed UTF-8");
    return *c;
  }

  Result<Piece> group(int depth) {
    ++i_;
    if (depth + 1 > kMaxGroupDepth) {
      return error("groups nested deeper than " + std::to_string(kMaxGroupDepth));
    }
    if (!done() && p_[i_] == '?') {
      const std::string_view rest = p_.substr(i_);
      if (rest.starts_with("?:")) {
        i_ += 2;
      } else if (rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<=") ||
                 rest.starts_with("?<!")) {
        return error("lookaround is not supported");
      } else if (rest.starts_with("?<")) {
        // A named group: the name only matters to backreferences, which are refused.
        const size_t close = rest.find('>');
        if (close == std::string_view::npos || close == 2) return error("malformed group name");
        for (size_t k = 2; k < close; ++k) {
          const char n = rest[k];
          const bool ok = (n >= 'a' && n <= 'z') || (n >= 'A' && n <= 'Z') || n == '_' ||
                          n == '$' || (k > 2 && n >= '0' && n <= '9');
          if (!ok) return error("malformed group name");
        }
        i_ += close + 1;
      } else {
        return error("group syntax '(?' other than '(?:' and '(?<name>' is not supported");
      }
    }
    PS_ASSIGN_OR_RETURN(std::string inner, alternation(depth + 1));
    if (done() || p_[i_] != ')') return error("missing ')'");
    ++i_;
    return Piece{"(?:" + inner + ")", true};
  }

  Result<CodeSet> bracket_class() {
    ++i_;
    const bool negated = !done() && p_[i_] == '^';
    if (negated) ++i_;
    if (!done() && p_[i_] == ']') {
      return error("an empty class '[]' or '[^]' is not supported");
    }
    CodeSet set;
    while (true) {
      if (done()) return error("missing ']'");
      if (p_[i_] == ']') {
        ++i_;
        break;
      }
      PS_ASSIGN_OR_RETURN(EscapeValue first, class_member());
      if (first.is_char && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        PS_ASSIGN_OR_RETURN(EscapeValue last, class_member());
        if (!last.is_char) return error("a class range ending in a class escape");
        if (last.set[0].first < first.set[0].first) return error("a class range out of order");
        set.emplace_back(first.set[0].first, last.set[0].first);
      } else {
        set.insert(set.end(), first.set.begin(), first.set.end());
      }
    }
    set = normalized(std::move(set));
    return negated ? complement(set) : set;
  }

  Result<EscapeValue> class_member() {
    if (p_[i_] == '\\') return escape(true);
    PS_ASSIGN_OR_RETURN(char32_t c, next_char());
    return one_char(c);
  }

  Result<char32_t> hex_digits(int count) {
    char32_t value = 0;
    for (int k = 0; k < count; ++k) {
      const int digit = done() ? -1 : hex_value(p_[i_]);
      if (digit < 0) return error("malformed hex escape");
      value = value * 16 + static_cast<char32_t>(digit);
      ++i_;
    }
    return value;
  }

  // The escape at i_ (a backslash); inside a class \b is a backspace.
  Result<EscapeValue> escape(bool in_class) {
    ++i_;
    if (done()) return error("a trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return EscapeValue{kDigits, false};
      case 'D':
        return EscapeValue{complement(kDigits), false};
      case 'w':
        return EscapeValue{kWord, false};
      case 'W':
        return EscapeValue{complement(kWord), false};
      case 's':
        return EscapeValue{kSpace, false};
      case 'S':
        return EscapeValue{complement(kSpace), false};
      case 'n':
        return one_char('\n');
      case 'r':
        return one_char('\r');
      case 't':
        return one_char('\t');
      case 'f':
        return one_char('\f');
      case 'v':
        return one_char('\v');
      case '0':
        if (!done() && p_[i_] >= '0' && p_[i_] <= '9') return error("octal escapes");
        return one_char(0);
      case 'b':
        if (in_class) return one_char('\b');
        return error("word boundary '\\b' is not supported");
      case 'x': {
        PS_ASSIGN_OR_RETURN(char32_t value, hex_digits(2));
        return one_char(value);
      }
      case 'u': {
        PS_ASSIGN_OR_RETURN(char32_t value, hex_digits(4));
        if (value >= 0xDC00 && value <= 0xDFFF) return error("a lone surrogate escape");
        if (value >= 0xD800 && value <= 0xDBFF) {
          // A surrogate pair spells one character beyond the BMP.
          if (!p_.substr(i_).starts_with("\\u")) return error("a lone surrogate escape");
          i_ += 2;
          PS_ASSIGN_OR_RETURN(char32_t low, hex_digits(4));
          if (low < 0xDC00 || low > 0xDFFF) return error("a lone surrogate escape");
          value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00);
        }
        return one_char(value);
      }
      default:
        break;
    }
    if (c >= '1' && c <= '9') return error("backreferences are not supported");
    const auto byte = static_cast<unsigned char>(c);
    const bool alphanumeric =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (byte < 0x80 && byte >= 0x20 && !alphanumeric) return one_char(byte);
    --i_;
    // Only a printable byte goes into the message: it must stay valid UTF-8 (it may end up
    // in a JSON error response).
    if (byte < 0x20 || byte >= 0x7F) return error("a backslash before a non-ASCII or control byte");
    return error(std::string("escape '\\") + c + "' is not supported");
  }

  std::string_view p_;
  size_t i_ = 0;
};

}  // namespace

Result<std::string> json_string_pattern_regex(std::string_view pattern) {
  return PatternParser(pattern).parse();
}

}  // namespace peerserve::grammar
