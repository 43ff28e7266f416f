// UTF-8 scanning shared by the tokenizer, the decoder and the streaming detokenizer.
//
// Invalid input is handled with the Unicode "substitution of maximal subparts" rule (the
// one WHATWG TextDecoder and Rust's String::from_utf8_lossy use): every maximal prefix of
// a well-formed sequence that cannot be completed, and every byte that cannot start one,
// becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace peerserve::utf8 {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

enum class SequenceKind {
  kValid,       // `length` bytes form one well-formed character
  kInvalid,     // `length` bytes (>= 1) are a maximal subpart: replace by one U+FFFD
  kIncomplete,  // all `length` remaining bytes are a proper prefix of a valid sequence
};

struct Sequence {
  SequenceKind kind;
  size_t length;
};

// Classifies the sequence that starts at text[0]. REQUIRES: !text.empty().
Sequence next_sequence(std::string_view text);

// Replaces invalid UTF-8 (including a truncated tail) by U+FFFD.
std::string make_valid(std::string_view text);

bool is_valid(std::string_view text);

// Decodes the code point of a kValid sequence.
char32_t decode_valid(std::string_view sequence);

void append_code_point(std::string& out, char32_t code_point);

// Code points of valid UTF-8 (bytes that do not continue a sequence): Python's len().
inline size_t count_code_points(std::string_view text) {
  size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace peerserve::utf8
