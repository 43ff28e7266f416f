#include "tokenizer/internal/byte_level.h"

#include "tokenizer/internal/utf8.h"

namespace peerserve::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int, 512> cp_to_byte{};  // every mapped code point is < 0x144

  Alphabet() {
    cp_to_byte.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp =
          printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet kAlphabet;
  return kAlphabet;
}

}  // namespace

char32_t byte_to_code_point(unsigned char byte) {
  return alphabet().byte_to_cp[byte];
}

std::optional<unsigned char> code_point_to_byte(char32_t cp) {
  if (cp >= alphabet().cp_to_byte.size() || alphabet().cp_to_byte[cp] < 0) return std::nullopt;
  return static_cast<unsigned char>(alphabet().cp_to_byte[cp]);
}

std::optional<std::string> decode_token_text(std::string_view text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Sequence seq = utf8::next_sequence(text.substr(pos));
    if (seq.kind != utf8::SequenceKind::kValid) return std::nullopt;
    const auto byte = code_point_to_byte(utf8::decode_valid(text.substr(pos, seq.length)));
    if (!byte) return std::nullopt;
    out.push_back(static_cast<char>(*byte));
    pos += seq.length;
  }
  return out;
}

std::string encode_bytes(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::append_code_point(out, byte_to_code_point(b));
  return out;
}

}  // namespace peerserve::byte_level
