// Python's str methods as chat templates see them (strip, split, replace, title, case
// mapping), on UTF-8 strings, with the sandbox's size bounds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace peerserve::jinja {

// Python's str.isspace() for the code points templates meet.
bool is_python_space(char32_t c);
// The UTF-8 sequences of `s`, one string per code point (invalid bytes stand alone).
std::vector<std::string> code_points(const std::string& s);
char32_t first_code_point(const std::string& cp);

// str.strip/lstrip/rstrip: whitespace, or any of the code points in `chars` (a string
// Value; nullptr or another type means whitespace).
std::string strip(const std::string& s, const Value* chars, bool left, bool right);

// Python's float(text): surrounding whitespace, single underscores between digits, "inf",
// "nan"; nullopt where Python raises ValueError (hexadecimal, which strtod would take, too).
std::optional<double> python_float(const std::string& text);

// Case mapping is ASCII-only (templates only change the case of ASCII role names).
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string title_case(const std::string& s);

// Python str.replace; nullopt when the result would pass `max_bytes`.
std::optional<std::string> replace_all(const std::string& s, const std::string& from,
                                       const std::string& to, int64_t count, uint64_t max_bytes);

// Python str.split(sep=None, maxsplit=-1); nullopt past `max_items` pieces.
std::optional<List> split(const std::string& s, const Value* sep, int64_t maxsplit,
                          int64_t max_items);

}  // namespace peerserve::jinja
