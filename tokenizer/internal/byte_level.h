// GPT-2's byte-level alphabet: every byte maps to one printable code point, so that BPE
// vocabularies can be stored as text. Printable Latin-1 bytes map to themselves; the
// others map to U+0100.. in byte order.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace peerserve::byte_level {

// The code point that stands for `byte`.
char32_t byte_to_code_point(unsigned char byte);

// The byte a code point stands for, or nullopt if it is not in the alphabet.
std::optional<unsigned char> code_point_to_byte(char32_t code_point);

// Maps a vocabulary string back to bytes; nullopt if a character is not in the alphabet.
// REQUIRES: text is valid UTF-8.
std::optional<std::string> decode_token_text(std::string_view text);

// Maps raw bytes to their vocabulary string.
std::string encode_bytes(std::string_view bytes);

}  // namespace peerserve::byte_level
