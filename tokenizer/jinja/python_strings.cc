#include "tokenizer/jinja/python_strings.h"

#include <cctype>
#include <cstdlib>

#include "tokenizer/internal/utf8.h"

namespace peerserve::jinja {
namespace {

bool is_ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace

bool is_python_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const utf8::Sequence seq = utf8::next_sequence(std::string_view(s).substr(pos));
    out.push_back(s.substr(pos, seq.length));
    pos += seq.length;
  }
  return out;
}

char32_t first_code_point(const std::string& cp) {
  return utf8::decode_valid(cp);
}

// Walks the string in place (message contents can be megabytes).
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string set;
  const bool use_set = chars != nullptr && chars->is_string();
  if (use_set) {
    for (const std::string& cp : code_points(chars->as_string())) set += first_code_point(cp);
  }
  const auto strip_this = [&](std::string_view cp) {
    const utf8::Sequence seq = utf8::next_sequence(cp);
    if (seq.kind != utf8::SequenceKind::kValid) return false;
    const char32_t c = utf8::decode_valid(cp.substr(0, seq.length));
    return use_set ? set.find(c) != std::u32string::npos : is_python_space(c);
  };
  const std::string_view text(s);
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end) {
      const size_t length = utf8::next_sequence(text.substr(begin, end - begin)).length;
      if (!strip_this(text.substr(begin, length))) break;
      begin += length;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;  // back to the lead byte of the last code point
      while (start > begin && end - start < 4 &&
             (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        --start;
      }
      const std::string_view last = text.substr(start, end - start);
      if (utf8::next_sequence(last).length != last.size() || !strip_this(last)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}
std::string title_case(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    if (is_ascii_alpha(c)) {
      c = previous_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      previous_cased = true;
    } else {
      previous_cased = (static_cast<unsigned char>(c) & 0x80) != 0 && previous_cased;
    }
  }
  return out;
}

std::optional<std::string> replace_all(const std::string& s, const std::string& from,
                                       const std::string& to, int64_t count, uint64_t max_bytes) {
  std::string out;
  const auto append = [&](std::string_view piece) {
    if (out.size() + piece.size() > max_bytes) return false;
    out += piece;
    return true;
  };
  if (from.empty()) {
    // Python inserts `to` between code points (and at both ends).
    int64_t done = 0;
    for (const std::string& cp : code_points(s)) {
      if (count < 0 || done < count) {
        if (!append(to)) return std::nullopt;
        ++done;
      }
      if (!append(cp)) return std::nullopt;
    }
    if ((count < 0 || done < count) && !append(to)) return std::nullopt;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    if (!append(std::string_view(s).substr(pos, hit - pos)) || !append(to)) return std::nullopt;
    pos = hit + from.size();
    ++done;
  }
  if (!append(std::string_view(s).substr(pos))) return std::nullopt;
  return out;
}

std::optional<List> split(const std::string& s, const Value* sep, int64_t maxsplit,
                          int64_t max_items) {
  List out;
  const auto full = [&] { return static_cast<int64_t>(out.size()) >= max_items; };
  if (sep == nullptr || sep->is_none()) {
    const std::vector<std::string> cps = code_points(s);
    size_t i = 0;
    int64_t splits = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_python_space(first_code_point(cps[i]))) ++i;
      if (i >= cps.size()) break;
      std::string word;
      if (full()) return std::nullopt;
      if (maxsplit >= 0 && splits >= maxsplit) {
        for (; i < cps.size(); ++i) word += cps[i];  // the rest, trailing spaces kept
        out.emplace_back(std::move(word));
        break;
      }
      while (i < cps.size() && !is_python_space(first_code_point(cps[i]))) word += cps[i++];
      out.emplace_back(std::move(word));
      ++splits;
    }
    return out;
  }
  const std::string& separator = sep->as_string();
  size_t pos = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    const size_t hit = s.find(separator, pos);
    if (hit == std::string::npos) break;
    if (full()) return std::nullopt;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + separator.size();
    ++splits;
  }
  if (full()) return std::nullopt;
  out.emplace_back(s.substr(pos));
  return out;
}

std::optional<double> python_float(const std::string& text) {
  const std::string s = strip(text, nullptr, true, true);
  std::string plain;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == 'x' || c == 'X' || c == '(') return std::nullopt;  // hex floats, nan(...)
    if (c == '_') {
      const bool between_digits = i > 0 && i + 1 < s.size() &&
                                  std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                                  std::isdigit(static_cast<unsigned char>(s[i + 1]));
      if (!between_digits) return std::nullopt;
      continue;
    }
    plain += c;
  }
  if (plain.empty()) return std::nullopt;
  // strtod, not stod: out of range it gives +-inf or the (sub)normal/zero, as Python does.
  char* end = nullptr;
  const double value = std::strtod(plain.c_str(), &end);
  if (end == plain.c_str() + plain.size()) return value;
  return std::nullopt;
}

}  // namespace peerserve::jinja
